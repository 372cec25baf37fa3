//! USER_RECOVERY: taking over a device whose server died.
//!
//! With `UBLK_F_USER_RECOVERY` the driver does not delete a device when
//! its server's io_uring goes away (a crash, `kill -9`): it quiesces the
//! block queue, keeps every request that was not answered yet (with
//! `UBLK_F_USER_RECOVERY_REISSUE` also those the dead server had been
//! handed: they are requeued, to be sent again), and marks the device
//! `QUIESCED`. A new server then takes over (Linux 6.12's
//! `drivers/block/ublk_drv.c`, facts only):
//!
//! 1. `START_USER_RECOVERY` — refused with `EBUSY` until the device is
//!    `QUIESCED` *and* the old server's `/dev/ublkcN` is closed (the
//!    dying process's io_uring is freed asynchronously, after the process
//!    is gone), so it is retried for a while ([`poll_until`]). It makes
//!    every tag forget its old command. It succeeds only once per crash:
//!    a second START before END is refused (`EINVAL`: no queue is
//!    ready), so a takeover that fails after it leaves the device to
//!    `mcqio-ublk del`.
//! 2. Open `/dev/ublkcN` again, map each queue's descriptors, FETCH every
//!    tag of every queue (exactly as a first start).
//! 3. `END_USER_RECOVERY` with the new server's pid — it waits until
//!    every queue has fetched all its tags, then unquiesces the queue and
//!    kicks the requeue list: the kept requests arrive at the new server.
//!
//! The device's parameters stay the kernel's (SET_PARAMS is refused once a
//! device has been started), so the new server must serve *the same*
//! geometry: [`check_takeover`] compares what the engine reports now with
//! what the kernel kept.
//!
//! What the engine needs on reopen: nothing of the dead process survives
//! in user space. The kernel closed its VFIO group and device files on
//! exit, which resets the function and drops its IOMMU mappings, so the
//! next open finds a quiet controller and initialises it from scratch, like
//! any first open; the data is on the device. An in-process fake dies with
//! its server, and a fresh fake would serve other bytes (zeroes) under the
//! reissued requests and the filesystem above them — so recovery is
//! refused for fakes ([`recoverable`]).
//!
//! Seen in the guest (Debian 6.12.95): in 2 of 4 runs the `kill -9`
//! itself oopsed the kernel, in io_uring's exit path (`io_fallback_tw`
//! from `do_exit` of a queue thread, running a ublk request's task work
//! against a ring already freed). Nothing a killed server runs can avoid
//! that; in the runs without it the takeover worked and fio's verify
//! passed (`fixtures/vm/README.md`, ublk).

use std::time::{Duration, Instant};

use mcqio_open::{DeviceKind, DeviceSpec};

use crate::ctrl::{self, Control, CtrlError};
use crate::sys::{self, DevInfo, Params};
use crate::target::Caps;

/// What a takeover asks of `/dev/ublk-control` before its queues start: a
/// seam, so the waiting and retrying are tested without a driver.
pub trait RecoveryControl {
    /// GET_DEV_INFO.
    fn info(&mut self, dev_id: u32) -> Result<DevInfo, CtrlError>;
    /// START_USER_RECOVERY.
    fn start_recovery(&mut self, dev_id: u32) -> Result<(), CtrlError>;
}

impl RecoveryControl for Control {
    fn info(&mut self, dev_id: u32) -> Result<DevInfo, CtrlError> {
        Control::info(self, dev_id)
    }
    fn start_recovery(&mut self, dev_id: u32) -> Result<(), CtrlError> {
        Control::start_recovery(self, dev_id)
    }
}

/// Wait (at most `wait`, asking every `every`) until the driver has
/// noticed the death of device `id`'s server and quiesced it; its info
/// then. Refused at once for a device added without recovery (the kernel
/// deletes those with their server) and for a stopped one.
pub fn wait_quiesced(
    c: &mut impl RecoveryControl,
    id: u32,
    wait: Duration,
    every: Duration,
) -> Result<DevInfo, String> {
    let mut last = c.info(id).map_err(|e| e.to_string())?;
    if last.flags & sys::F_USER_RECOVERY == 0 {
        return Err(format!(
            "device {id} was added without --recovery: nothing to take over"
        ));
    }
    let got = poll_until(wait, every, || {
        let i = c.info(id).map_err(|e| e.to_string())?;
        last = i;
        match i.state {
            sys::DEV_QUIESCED => Ok(Some(i)),
            sys::DEV_DEAD => Err(format!(
                "device {id} is stopped (DEAD): nothing to recover (`mcqio-ublk del {id}` removes it)"
            )),
            _ => Ok(None),
        }
    })?;
    got.ok_or_else(|| {
        format!(
            "device {id} is still {} with server pid {} after {wait:?}: recover takes over only from a dead server",
            ctrl::state_name(last.state),
            last.ublksrv_pid
        )
    })
}

/// START_USER_RECOVERY for device `id`, retried while the driver answers
/// `EBUSY` (the dead server's `/dev/ublkcN` not yet released), at most
/// `wait`; any other error ends it at once.
pub fn start_takeover(
    c: &mut impl RecoveryControl,
    id: u32,
    wait: Duration,
    every: Duration,
) -> Result<(), String> {
    poll_until(wait, every, || match c.start_recovery(id) {
        Ok(()) => Ok(Some(())),
        Err(CtrlError::Command { ref err, .. }) if err.raw_os_error() == Some(libc::EBUSY) => {
            Ok(None)
        }
        Err(e) => Err(e.to_string()),
    })?
    .ok_or_else(|| {
        format!(
            "START_USER_RECOVERY for device {id} still busy after {wait:?}: is /dev/ublkc{id} still open?"
        )
    })
}

/// Why a device cannot be recovered onto this spec, or `Ok` if it can.
pub fn recoverable(spec: &DeviceSpec) -> Result<(), String> {
    match spec.kind {
        DeviceKind::Vfio { .. } => Ok(()),
        // The target outlives the server, but the dead server's commands
        // may still be running on it: closing the connections does not
        // stop a write the target already took, and nothing tells a new
        // association when the old one's commands have ended (NVMe's
        // answer is to wait out the keep-alive and the Command Quiesce
        // Time, which Linux's nvmet does not report). A reissued read or a
        // later write could then be overtaken by a stale write.
        DeviceKind::Tcp { .. } => Err(format!(
            "{}: an NVMe/TCP target may still run the dead server's commands after its \
             connections closed, and a new association cannot learn when they ended, so \
             reissued requests could be overtaken by a stale write",
            spec.label()
        )),
        _ => Err(format!(
            "{}: only a device that outlives its server can be recovered (vfio:<BDF>); \
             an in-process fake died with the server that held it, and a fresh one would \
             serve other bytes under the reissued requests",
            spec.label()
        )),
    }
}

/// Whether the kernel's record of device `info` / `params` can be served by
/// a device with `caps` after a crash; `Ok` gives the caps to serve with
/// (the tag buffers as large as the kernel's largest request).
pub fn check_takeover(info: &DevInfo, params: &Params, caps: &Caps) -> Result<Caps, String> {
    let id = info.dev_id;
    if info.flags & sys::F_USER_RECOVERY == 0 {
        return Err(format!(
            "device {id} was added without --recovery: the kernel deletes such a device when its server dies"
        ));
    }
    if params.types & sys::PARAM_TYPE_BASIC == 0 {
        return Err(format!(
            "device {id} has no parameters: it was never started"
        ));
    }
    let b = &params.basic;
    if u32::from(b.logical_bs_shift) != caps.block_shift {
        return Err(format!(
            "device {id} has {} B blocks, the engine's unit {} B: not the device it served",
            1u64 << b.logical_bs_shift,
            1u64 << caps.block_shift
        ));
    }
    let sectors = caps.blocks << (caps.block_shift - 9);
    if b.dev_sectors != sectors {
        return Err(format!(
            "device {id} has {} sectors, the engine's unit {sectors}: not the device it served",
            b.dev_sectors
        ));
    }
    let largest = u64::from(b.max_sectors) << 9;
    if largest > u64::from(caps.max_io) {
        return Err(format!(
            "device {id} sends requests of up to {largest} B, the engine moves at most {} B at once now",
            caps.max_io
        ));
    }
    Ok(Caps {
        max_io: largest as u32,
        ..*caps
    })
}

/// Call `f` every `every` until it gives `Some`, fails, or `timeout` has
/// passed (then `Ok(None)`); `f` runs at least once.
pub fn poll_until<T, E>(
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f()? {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::VecDeque;
    use std::io;

    /// A control device that answers from a script.
    #[derive(Default)]
    struct Scripted {
        states: VecDeque<u16>,
        flags: u64,
        starts: VecDeque<i32>,
        info_calls: usize,
        start_calls: usize,
    }

    impl RecoveryControl for Scripted {
        fn info(&mut self, dev_id: u32) -> Result<DevInfo, CtrlError> {
            self.info_calls += 1;
            let state = if self.states.len() > 1 {
                self.states.pop_front().unwrap()
            } else {
                self.states[0]
            };
            Ok(DevInfo {
                dev_id,
                state,
                flags: self.flags,
                ublksrv_pid: 42,
                ..DevInfo::default()
            })
        }
        fn start_recovery(&mut self, dev_id: u32) -> Result<(), CtrlError> {
            self.start_calls += 1;
            match self.starts.pop_front().unwrap_or(0) {
                0 => Ok(()),
                e => Err(CtrlError::Command {
                    command: "START_USER_RECOVERY",
                    dev_id,
                    err: io::Error::from_raw_os_error(e),
                }),
            }
        }
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn the_takeover_waits_for_the_quiesce() {
        let mut c = Scripted {
            states: [
                sys::DEV_LIVE,
                sys::DEV_LIVE,
                sys::DEV_LIVE,
                sys::DEV_QUIESCED,
            ]
            .into(),
            flags: REC,
            ..Scripted::default()
        };
        let i = wait_quiesced(&mut c, 0, T, Duration::ZERO).unwrap();
        assert_eq!(i.state, sys::DEV_QUIESCED);
        assert_eq!(c.info_calls, 4);
    }

    #[test]
    fn a_live_server_a_stopped_device_or_no_recovery_is_refused() {
        let mut c = Scripted {
            states: [sys::DEV_LIVE].into(),
            flags: REC,
            ..Scripted::default()
        };
        let e = wait_quiesced(
            &mut c,
            0,
            Duration::from_millis(20),
            Duration::from_millis(5),
        )
        .unwrap_err();
        assert!(e.contains("still LIVE with server pid 42"), "{e}");

        let mut c = Scripted {
            states: [sys::DEV_LIVE, sys::DEV_DEAD].into(),
            flags: REC,
            ..Scripted::default()
        };
        let e = wait_quiesced(&mut c, 0, T, Duration::ZERO).unwrap_err();
        assert!(e.contains("DEAD"), "{e}");

        let mut c = Scripted {
            states: [sys::DEV_QUIESCED].into(),
            flags: sys::F_URING_CMD_COMP_IN_TASK,
            ..Scripted::default()
        };
        let e = wait_quiesced(&mut c, 0, T, Duration::ZERO).unwrap_err();
        assert!(e.contains("without --recovery"), "{e}");
        assert_eq!(c.info_calls, 1);
    }

    #[test]
    fn start_recovery_is_retried_while_busy_only() {
        let mut c = Scripted {
            starts: [libc::EBUSY, libc::EBUSY, 0].into(),
            ..Scripted::default()
        };
        start_takeover(&mut c, 0, T, Duration::ZERO).unwrap();
        assert_eq!(c.start_calls, 3);

        // A second START after one that succeeded is EINVAL: not retried.
        let mut c = Scripted {
            starts: [libc::EBUSY, libc::EINVAL, 0].into(),
            ..Scripted::default()
        };
        let e = start_takeover(&mut c, 0, T, Duration::ZERO).unwrap_err();
        assert!(e.contains("Invalid argument"), "{e}");
        assert_eq!(c.start_calls, 2);

        let mut c = Scripted {
            starts: std::iter::repeat_n(libc::EBUSY, 1000).collect(),
            ..Scripted::default()
        };
        let e = start_takeover(
            &mut c,
            0,
            Duration::from_millis(20),
            Duration::from_millis(5),
        )
        .unwrap_err();
        assert!(e.contains("still busy"), "{e}");
    }

    fn caps() -> Caps {
        Caps {
            block_shift: 12,
            blocks: 1 << 16,
            max_io: 1 << 20,
            volatile_cache: true,
            fua: true,
            discard: true,
            discard_zeroes: true,
            write_zeroes_blocks: 0,
        }
    }

    fn kept(flags: u64, shift: u8, sectors: u64, max_sectors: u32) -> (DevInfo, Params) {
        let info = DevInfo {
            dev_id: 3,
            flags,
            ..DevInfo::default()
        };
        let mut p = Params {
            types: sys::PARAM_TYPE_BASIC,
            ..Params::default()
        };
        p.basic.logical_bs_shift = shift;
        p.basic.dev_sectors = sectors;
        p.basic.max_sectors = max_sectors;
        (info, p)
    }

    const REC: u64 = sys::F_USER_RECOVERY | sys::F_USER_RECOVERY_REISSUE;

    #[test]
    fn the_same_geometry_is_taken_over_with_the_kernels_request_size() {
        let (i, p) = kept(REC, 12, (1 << 16) << 3, 256);
        let c = check_takeover(&i, &p, &caps()).unwrap();
        assert_eq!(c.max_io, 256 << 9);
        assert_eq!(c.blocks, caps().blocks);
    }

    #[test]
    fn a_device_added_without_recovery_is_refused() {
        let (i, p) = kept(sys::F_USER_COPY, 12, (1 << 16) << 3, 256);
        let e = check_takeover(&i, &p, &caps()).unwrap_err();
        assert!(e.contains("without --recovery"), "{e}");
    }

    #[test]
    fn another_geometry_is_refused() {
        let (i, p) = kept(REC, 9, (1 << 16) << 3, 256);
        assert!(check_takeover(&i, &p, &caps())
            .unwrap_err()
            .contains("blocks"));
        let (i, p) = kept(REC, 12, ((1 << 16) << 3) + 8, 256);
        assert!(check_takeover(&i, &p, &caps())
            .unwrap_err()
            .contains("sectors"));
        let (i, p) = kept(REC, 12, (1 << 16) << 3, 4096);
        assert!(check_takeover(&i, &p, &caps())
            .unwrap_err()
            .contains("at most"));
        let (i, mut p) = kept(REC, 12, (1 << 16) << 3, 256);
        p.types = 0;
        assert!(check_takeover(&i, &p, &caps())
            .unwrap_err()
            .contains("never started"));
    }

    #[test]
    fn fakes_are_not_recoverable_vfio_is() {
        for s in ["fake", "fake,size=64m", "fake-ufs", "fake:null"] {
            let spec: DeviceSpec = s.parse().unwrap();
            assert!(recoverable(&spec).unwrap_err().contains("outlives"), "{s}");
        }
        let spec: DeviceSpec = "vfio:0000:00:04.0".parse().unwrap();
        recoverable(&spec).unwrap();
    }

    #[test]
    fn a_tcp_target_is_refused_for_its_own_reason() {
        let spec: DeviceSpec = "tcp:127.0.0.1:4420/nqn.2026-01.io.mcqio:t".parse().unwrap();
        let e = recoverable(&spec).unwrap_err();
        assert!(e.contains("association") && e.contains("reissued"), "{e}");
    }

    #[test]
    fn polling_stops_at_the_first_answer_an_error_or_the_deadline() {
        let n = Cell::new(0);
        let r: Result<_, ()> = poll_until(Duration::from_secs(5), Duration::ZERO, || {
            n.set(n.get() + 1);
            Ok((n.get() == 3).then_some(n.get()))
        });
        assert_eq!(r, Ok(Some(3)));

        let n = Cell::new(0);
        let r: Result<Option<()>, u32> = poll_until(Duration::from_secs(5), Duration::ZERO, || {
            n.set(n.get() + 1);
            if n.get() == 2 {
                Err(7)
            } else {
                Ok(None)
            }
        });
        assert_eq!((r, n.get()), (Err(7), 2));

        let t0 = Instant::now();
        let r: Result<Option<()>, ()> =
            poll_until(Duration::from_millis(30), Duration::from_millis(5), || {
                Ok(None)
            });
        assert_eq!(r, Ok(None));
        assert!(t0.elapsed() >= Duration::from_millis(30));
    }
}
