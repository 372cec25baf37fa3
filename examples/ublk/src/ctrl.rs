//! `/dev/ublk-control`: adding, starting, stopping, deleting and listing
//! ublk devices. Each command is one `IORING_OP_URING_CMD` on a small
//! ring of 128-byte SQEs (the command is 32 bytes), sent and waited for.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::sys::{self, CtrlCmd, DevInfo, Params};

/// The control device node.
pub const CONTROL: &str = "/dev/ublk-control";

/// Why a control command failed.
#[derive(Debug, thiserror::Error)]
pub enum CtrlError {
    /// `/dev/ublk-control` cannot be opened.
    #[error("cannot open {CONTROL}: {0} (is the ublk_drv module loaded? `modprobe ublk_drv`; it needs Linux 6.12 or later here, and root)")]
    Open(#[source] io::Error),
    /// The control ring could not be set up or entered.
    #[error("control ring: {0}")]
    Ring(#[source] io::Error),
    /// The driver answered a command with an error.
    #[error("{command} for device {dev_id}: {err}")]
    Command {
        /// Which command.
        command: &'static str,
        /// The device.
        dev_id: u32,
        /// The driver's errno.
        #[source]
        err: io::Error,
    },
}

/// An open control device.
pub struct Control {
    file: File,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
}

impl Control {
    /// Open `/dev/ublk-control` and its ring.
    pub fn open() -> Result<Self, CtrlError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(CONTROL)
            .map_err(CtrlError::Open)?;
        let ring = IoUring::builder().build(4).map_err(CtrlError::Ring)?;
        Ok(Control { file, ring })
    }

    /// Send one command and wait for its result (>= 0).
    fn send(&mut self, op: u32, name: &'static str, cmd: CtrlCmd) -> Result<i32, CtrlError> {
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), op)
            .cmd(cmd.to_bytes())
            .build()
            .user_data(u64::from(op));
        // SAFETY: `cmd.addr`, if set, points at a buffer of `cmd.len`
        // bytes of the caller's that lives until this function returns,
        // and this function returns only after the command's completion.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| CtrlError::Ring(io::Error::other("control SQ full")))?;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(CtrlError::Ring(e)),
            }
        }
        let cqe = loop {
            if let Some(c) = self.ring.completion().next() {
                break c;
            }
            self.ring.submit_and_wait(1).map_err(CtrlError::Ring)?;
        };
        let r = cqe.result();
        if r < 0 {
            return Err(CtrlError::Command {
                command: name,
                dev_id: cmd.dev_id,
                err: io::Error::from_raw_os_error(-r),
            });
        }
        Ok(r)
    }

    fn cmd(dev_id: u32) -> CtrlCmd {
        CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            ..CtrlCmd::default()
        }
    }

    /// The driver's feature flags (`UBLK_F_*` it supports).
    pub fn features(&mut self) -> Result<u64, CtrlError> {
        let mut f = 0u64;
        let mut c = Self::cmd(0);
        c.addr = std::ptr::from_mut(&mut f) as u64;
        c.len = 8;
        self.send(sys::CMD_GET_FEATURES, "GET_FEATURES", c)?;
        Ok(f)
    }

    /// Create a device (`info.dev_id == u32::MAX`: the driver picks the
    /// id); returns the info the driver settled on.
    pub fn add(&mut self, mut info: DevInfo) -> Result<DevInfo, CtrlError> {
        let mut c = Self::cmd(info.dev_id);
        c.addr = std::ptr::from_mut(&mut info) as u64;
        c.len = std::mem::size_of::<DevInfo>() as u16;
        self.send(sys::CMD_ADD_DEV, "ADD_DEV", c)?;
        Ok(info)
    }

    /// Set the block device's parameters (before START_DEV).
    pub fn set_params(&mut self, dev_id: u32, p: &Params) -> Result<(), CtrlError> {
        let mut p = *p;
        p.len = std::mem::size_of::<Params>() as u32;
        let mut c = Self::cmd(dev_id);
        c.addr = std::ptr::from_mut(&mut p) as u64;
        c.len = p.len as u16;
        self.send(sys::CMD_SET_PARAMS, "SET_PARAMS", c).map(drop)
    }

    /// The device's parameters.
    pub fn params(&mut self, dev_id: u32) -> Result<Params, CtrlError> {
        let mut p = Params {
            len: std::mem::size_of::<Params>() as u32,
            ..Params::default()
        };
        let mut c = Self::cmd(dev_id);
        c.addr = std::ptr::from_mut(&mut p) as u64;
        c.len = p.len as u16;
        self.send(sys::CMD_GET_PARAMS, "GET_PARAMS", c)?;
        Ok(p)
    }

    /// The device's info.
    pub fn info(&mut self, dev_id: u32) -> Result<DevInfo, CtrlError> {
        let mut info = DevInfo::default();
        let mut c = Self::cmd(dev_id);
        c.addr = std::ptr::from_mut(&mut info) as u64;
        c.len = std::mem::size_of::<DevInfo>() as u16;
        self.send(sys::CMD_GET_DEV_INFO, "GET_DEV_INFO", c)?;
        Ok(info)
    }

    /// Start the device: every queue has fetched all its tags, served by
    /// process `pid`; the driver then adds `/dev/ublkbN` (and reads its
    /// partition table through the queues).
    pub fn start(&mut self, dev_id: u32, pid: i32) -> Result<(), CtrlError> {
        let mut c = Self::cmd(dev_id);
        c.data = pid as u64;
        self.send(sys::CMD_START_DEV, "START_DEV", c).map(drop)
    }

    /// Stop the device: the block device goes away and every fetch is
    /// aborted (the queues see [`sys::IO_RES_ABORT`]).
    pub fn stop(&mut self, dev_id: u32) -> Result<(), CtrlError> {
        self.send(sys::CMD_STOP_DEV, "STOP_DEV", Self::cmd(dev_id))
            .map(drop)
    }

    /// Delete the device (after its server closed `/dev/ublkcN`).
    pub fn delete(&mut self, dev_id: u32) -> Result<(), CtrlError> {
        self.send(sys::CMD_DEL_DEV, "DEL_DEV", Self::cmd(dev_id))
            .map(drop)
    }

    /// USER_RECOVERY: begin taking over a device whose server died.
    pub fn start_recovery(&mut self, dev_id: u32) -> Result<(), CtrlError> {
        self.send(
            sys::CMD_START_USER_RECOVERY,
            "START_USER_RECOVERY",
            Self::cmd(dev_id),
        )
        .map(drop)
    }

    /// USER_RECOVERY: the new server (process `pid`) has fetched every
    /// tag; the device goes live again.
    pub fn end_recovery(&mut self, dev_id: u32, pid: i32) -> Result<(), CtrlError> {
        let mut c = Self::cmd(dev_id);
        c.data = pid as u64;
        self.send(sys::CMD_END_USER_RECOVERY, "END_USER_RECOVERY", c)
            .map(drop)
    }
}

/// The ids of the ublk devices that exist: the `/dev/ublkcN` nodes
/// devtmpfs creates for each (also for a device whose server died).
pub fn device_ids() -> Vec<u32> {
    let mut ids: Vec<u32> = std::fs::read_dir("/dev")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("ublkc"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// `flags` as names.
pub fn flag_names(flags: u64) -> String {
    let mut v: Vec<String> = sys::FLAG_NAMES
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, n)| (*n).to_string())
        .collect();
    let known = sys::FLAG_NAMES.iter().fold(0, |a, (b, _)| a | b);
    if flags & !known != 0 {
        v.push(format!("{:#x}", flags & !known));
    }
    v.join(",")
}

/// A device state as a word.
pub fn state_name(s: u16) -> &'static str {
    match s {
        sys::DEV_DEAD => "DEAD",
        sys::DEV_LIVE => "LIVE",
        sys::DEV_QUIESCED => "QUIESCED",
        _ => "UNKNOWN",
    }
}
