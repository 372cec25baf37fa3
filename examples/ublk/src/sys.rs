//! The ublk user ABI (`include/uapi/linux/ublk_cmd.h`), written out by hand
//! as `#[repr(C)]` structs with their sizes and offsets checked at compile
//! time, and the ioctl-encoded command numbers checked against the values
//! the 6.12 header yields.
//!
//! Only what a server of 6.12 needs is here: the control commands, the
//! FETCH / COMMIT_AND_FETCH I/O commands, the descriptor array, the
//! parameter blocks that 6.12 knows (basic, discard, devt, zoned) and the
//! USER_COPY offset encoding. Newer kernels accept this smaller
//! `ublk_params` (its `len` says how much we send).

#![allow(missing_docs)] // the names are the header's; each block says where it comes from

use std::mem::{offset_of, size_of};

// ------------------------------------------------------------ ioctl encoding

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// `_IOC(dir, 'u', nr, size)` as the generic Linux encoding (x86_64 and
/// arm64 share it).
const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << IOC_DIRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
        | ((b'u' as u32) << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
}
const fn ior(nr: u32, size: usize) -> u32 {
    ioc(IOC_READ, nr, size)
}
const fn iowr(nr: u32, size: usize) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, size)
}

// ------------------------------------------------------------ control commands

/// `struct ublksrv_ctrl_cmd`: the 32 bytes in an SQE128's command area.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CtrlCmd {
    /// Device the command is for (`u32::MAX`: let ADD_DEV pick one).
    pub dev_id: u32,
    /// Queue, or `u16::MAX` for a device-wide command.
    pub queue_id: u16,
    /// Bytes at `addr`.
    pub len: u16,
    /// A buffer in our address space the command reads or fills.
    pub addr: u64,
    /// Inline argument (START_DEV: the server's pid).
    pub data: u64,
    /// Only for unprivileged devices and GET_DEV_INFO2.
    pub dev_path_len: u16,
    pub pad: u16,
    pub reserved: u32,
}
const _: () = {
    assert!(size_of::<CtrlCmd>() == 32);
    assert!(offset_of!(CtrlCmd, addr) == 8);
    assert!(offset_of!(CtrlCmd, data) == 16);
    assert!(offset_of!(CtrlCmd, dev_path_len) == 24);
};

pub const CMD_GET_DEV_INFO: u32 = ior(0x02, size_of::<CtrlCmd>());
pub const CMD_ADD_DEV: u32 = iowr(0x04, size_of::<CtrlCmd>());
pub const CMD_DEL_DEV: u32 = iowr(0x05, size_of::<CtrlCmd>());
pub const CMD_START_DEV: u32 = iowr(0x06, size_of::<CtrlCmd>());
pub const CMD_STOP_DEV: u32 = iowr(0x07, size_of::<CtrlCmd>());
pub const CMD_SET_PARAMS: u32 = iowr(0x08, size_of::<CtrlCmd>());
pub const CMD_GET_PARAMS: u32 = ior(0x09, size_of::<CtrlCmd>());
pub const CMD_START_USER_RECOVERY: u32 = iowr(0x10, size_of::<CtrlCmd>());
pub const CMD_END_USER_RECOVERY: u32 = iowr(0x11, size_of::<CtrlCmd>());
pub const CMD_GET_FEATURES: u32 = ior(0x13, size_of::<CtrlCmd>());

/// `struct ublksrv_ctrl_dev_info` (64 bytes), ADD_DEV's argument and
/// GET_DEV_INFO's answer.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    /// [`DEV_DEAD`], [`DEV_LIVE`], [`DEV_QUIESCED`] (6.12 has no FAIL_IO).
    pub state: u16,
    pub pad0: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub pad1: u32,
    /// `F_*` feature flags of this device.
    pub flags: u64,
    /// The server's own, unseen by the driver.
    pub ublksrv_flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub reserved1: u64,
    pub reserved2: u64,
}
const _: () = {
    assert!(size_of::<DevInfo>() == 64);
    assert!(offset_of!(DevInfo, max_io_buf_bytes) == 8);
    assert!(offset_of!(DevInfo, ublksrv_pid) == 16);
    assert!(offset_of!(DevInfo, flags) == 24);
    assert!(offset_of!(DevInfo, owner_uid) == 40);
};

pub const DEV_DEAD: u16 = 0;
pub const DEV_LIVE: u16 = 1;
pub const DEV_QUIESCED: u16 = 2;

// Device feature flags (`UBLK_F_*`).
pub const F_SUPPORT_ZERO_COPY: u64 = 1 << 0;
pub const F_URING_CMD_COMP_IN_TASK: u64 = 1 << 1;
pub const F_NEED_GET_DATA: u64 = 1 << 2;
pub const F_USER_RECOVERY: u64 = 1 << 3;
pub const F_USER_RECOVERY_REISSUE: u64 = 1 << 4;
pub const F_UNPRIVILEGED_DEV: u64 = 1 << 5;
pub const F_CMD_IOCTL_ENCODE: u64 = 1 << 6;
pub const F_USER_COPY: u64 = 1 << 7;
pub const F_ZONED: u64 = 1 << 8;

/// Names of the flags, for `list` and error messages.
pub const FLAG_NAMES: &[(u64, &str)] = &[
    (F_SUPPORT_ZERO_COPY, "zero-copy"),
    (F_URING_CMD_COMP_IN_TASK, "comp-in-task"),
    (F_NEED_GET_DATA, "need-get-data"),
    (F_USER_RECOVERY, "user-recovery"),
    (F_USER_RECOVERY_REISSUE, "recovery-reissue"),
    (F_UNPRIVILEGED_DEV, "unprivileged"),
    (F_CMD_IOCTL_ENCODE, "ioctl-encode"),
    (F_USER_COPY, "user-copy"),
    (F_ZONED, "zoned"),
];

// ------------------------------------------------------------ parameters

pub const ATTR_READ_ONLY: u32 = 1 << 0;
pub const ATTR_ROTATIONAL: u32 = 1 << 1;
pub const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
pub const ATTR_FUA: u32 = 1 << 3;

/// `struct ublk_param_basic`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamBasic {
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    /// Largest request, in 512-byte sectors (at most `max_io_buf_bytes / 512`).
    pub max_sectors: u32,
    pub chunk_sectors: u32,
    /// Capacity in 512-byte sectors.
    pub dev_sectors: u64,
    pub virt_boundary_mask: u64,
}
const _: () = {
    assert!(size_of::<ParamBasic>() == 32);
    assert!(offset_of!(ParamBasic, max_sectors) == 8);
    assert!(offset_of!(ParamBasic, dev_sectors) == 16);
};

/// `struct ublk_param_discard`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamDiscard {
    pub discard_alignment: u32,
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_discard_segments: u16,
    pub reserved0: u16,
}
const _: () = assert!(size_of::<ParamDiscard>() == 20);

/// `struct ublk_param_devt` (read-only: the kernel fills it).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamDevt {
    pub char_major: u32,
    pub char_minor: u32,
    pub disk_major: u32,
    pub disk_minor: u32,
}
const _: () = assert!(size_of::<ParamDevt>() == 16);

/// `struct ublk_param_zoned` (unused here; part of 6.12's `ublk_params`).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamZoned {
    pub max_open_zones: u32,
    pub max_active_zones: u32,
    pub max_zone_append_sectors: u32,
    pub reserved: [u8; 20],
}
const _: () = assert!(size_of::<ParamZoned>() == 32);

pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;
pub const PARAM_TYPE_DEVT: u32 = 1 << 2;

/// `struct ublk_params` as of 6.12.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// Bytes of this struct the kernel should read (SET) or may fill (GET).
    pub len: u32,
    /// `PARAM_TYPE_*` blocks that are valid.
    pub types: u32,
    pub basic: ParamBasic,
    pub discard: ParamDiscard,
    pub devt: ParamDevt,
    pub zoned: ParamZoned,
}
const _: () = {
    assert!(offset_of!(Params, basic) == 8);
    assert!(offset_of!(Params, discard) == 40);
    assert!(offset_of!(Params, devt) == 60);
    assert!(offset_of!(Params, zoned) == 76);
    // 108 bytes of fields, padded to the 8-byte alignment of `basic`.
    assert!(size_of::<Params>() == 112);
};

// ------------------------------------------------------------ I/O commands

/// `struct ublksrv_io_cmd`: the 16 bytes in a plain SQE's command area.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    /// COMMIT: bytes done (reads/writes), 0, or a negative errno.
    pub result: i32,
    /// FETCH/COMMIT: the server's buffer for this tag (0 with USER_COPY).
    pub addr: u64,
}
const _: () = {
    assert!(size_of::<IoCmd>() == 16);
    assert!(offset_of!(IoCmd, result) == 4);
    assert!(offset_of!(IoCmd, addr) == 8);
};

impl IoCmd {
    /// The bytes of the SQE command area.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..2].copy_from_slice(&self.q_id.to_ne_bytes());
        b[2..4].copy_from_slice(&self.tag.to_ne_bytes());
        b[4..8].copy_from_slice(&self.result.to_ne_bytes());
        b[8..16].copy_from_slice(&self.addr.to_ne_bytes());
        b
    }
}

impl CtrlCmd {
    /// The bytes of an SQE128's 80-byte command area (the rest zero).
    pub fn to_bytes(self) -> [u8; 80] {
        let mut b = [0u8; 80];
        b[0..4].copy_from_slice(&self.dev_id.to_ne_bytes());
        b[4..6].copy_from_slice(&self.queue_id.to_ne_bytes());
        b[6..8].copy_from_slice(&self.len.to_ne_bytes());
        b[8..16].copy_from_slice(&self.addr.to_ne_bytes());
        b[16..24].copy_from_slice(&self.data.to_ne_bytes());
        b[24..26].copy_from_slice(&self.dev_path_len.to_ne_bytes());
        b
    }
}

pub const IO_FETCH_REQ: u32 = iowr(0x20, size_of::<IoCmd>());
pub const IO_COMMIT_AND_FETCH_REQ: u32 = iowr(0x21, size_of::<IoCmd>());

/// A FETCH's completion: a request is in the tag's descriptor.
pub const IO_RES_OK: i32 = 0;
/// A FETCH's completion: the queue is going away; do not fetch again.
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

/// `struct ublksrv_io_desc`, one per tag in the array the server maps
/// read-only from `/dev/ublkcN`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct IoDesc {
    /// Operation in bits 0–7, `IO_F_*` flags above.
    pub op_flags: u32,
    /// Length in 512-byte sectors.
    pub nr_sectors: u32,
    pub start_sector: u64,
    /// The buffer address given at FETCH (unused by us).
    pub addr: u64,
}
const _: () = {
    assert!(size_of::<IoDesc>() == 24);
    assert!(offset_of!(IoDesc, start_sector) == 8);
};

impl IoDesc {
    /// The operation (`IO_OP_*`).
    pub fn op(&self) -> u8 {
        (self.op_flags & 0xff) as u8
    }
    /// The flags (`IO_F_*`, as the header numbers them).
    pub fn flags(&self) -> u32 {
        self.op_flags & !0xff
    }
}

pub const IO_OP_READ: u8 = 0;
pub const IO_OP_WRITE: u8 = 1;
pub const IO_OP_FLUSH: u8 = 2;
pub const IO_OP_DISCARD: u8 = 3;
pub const IO_OP_WRITE_SAME: u8 = 4;
pub const IO_OP_WRITE_ZEROES: u8 = 5;

pub const IO_F_FAILFAST_DEV: u32 = 1 << 8;
pub const IO_F_FUA: u32 = 1 << 13;
pub const IO_F_NOUNMAP: u32 = 1 << 15;

/// Where the descriptor arrays start in `/dev/ublkcN`'s mmap space.
pub const CMD_BUF_OFFSET: u64 = 0;
/// Where USER_COPY's request data starts in `/dev/ublkcN`'s file offsets.
pub const IO_BUF_OFFSET: u64 = 0x8000_0000;
/// Most tags per queue.
pub const MAX_QUEUE_DEPTH: u16 = 4096;
/// The per-queue stride of the descriptor arrays: room for the deepest
/// queue, whatever this device's depth.
pub const fn cmd_buf_stride(page: usize) -> usize {
    (MAX_QUEUE_DEPTH as usize * size_of::<IoDesc>()).div_ceil(page) * page
}

// USER_COPY offsets: byte offset in bits 0..25, tag in 25..41, queue in 41..53.
const IO_BUF_BITS: u32 = 25;
const TAG_OFF: u32 = IO_BUF_BITS;
const TAG_BITS: u32 = 16;
const QID_OFF: u32 = TAG_OFF + TAG_BITS;

/// The file offset of byte `off` of request `(q, tag)`'s data, for
/// pread/pwrite on `/dev/ublkcN` with USER_COPY.
pub const fn user_copy_pos(q: u16, tag: u16, off: u32) -> u64 {
    IO_BUF_OFFSET | ((q as u64) << QID_OFF) | ((tag as u64) << TAG_OFF) | off as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command numbers as the 6.12 header's `_IOR`/`_IOWR` macros
    /// produce them (computed by hand from the encoding: dir << 30,
    /// size << 16, 'u' << 8, nr).
    #[test]
    fn command_numbers_match_the_header_encoding() {
        assert_eq!(CMD_GET_DEV_INFO, 0x8020_7502);
        assert_eq!(CMD_ADD_DEV, 0xc020_7504);
        assert_eq!(CMD_DEL_DEV, 0xc020_7505);
        assert_eq!(CMD_START_DEV, 0xc020_7506);
        assert_eq!(CMD_STOP_DEV, 0xc020_7507);
        assert_eq!(CMD_SET_PARAMS, 0xc020_7508);
        assert_eq!(CMD_GET_PARAMS, 0x8020_7509);
        assert_eq!(CMD_START_USER_RECOVERY, 0xc020_7510);
        assert_eq!(CMD_END_USER_RECOVERY, 0xc020_7511);
        assert_eq!(CMD_GET_FEATURES, 0x8020_7513);
        assert_eq!(IO_FETCH_REQ, 0xc010_7520);
        assert_eq!(IO_COMMIT_AND_FETCH_REQ, 0xc010_7521);
    }

    #[test]
    fn command_bytes_follow_the_struct_layout() {
        let c = IoCmd {
            q_id: 3,
            tag: 0x1234,
            result: -5,
            addr: 0x1122_3344_5566_7788,
        };
        let b = c.to_bytes();
        // SAFETY: IoCmd is repr(C), 16 bytes without padding, every bit
        // pattern valid; read_unaligned copes with the array's alignment.
        let back: IoCmd = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
        assert_eq!(back, c);
        let k = CtrlCmd {
            dev_id: 7,
            queue_id: u16::MAX,
            len: 64,
            addr: 0xdead_beef,
            data: 42,
            ..Default::default()
        };
        let b = k.to_bytes();
        // SAFETY: as above, CtrlCmd is 32 bytes of plain integers.
        let back: CtrlCmd = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
        assert_eq!(back, k);
        assert!(b[32..].iter().all(|&x| x == 0));
    }

    #[test]
    fn user_copy_offsets() {
        assert_eq!(user_copy_pos(0, 0, 0), 0x8000_0000);
        assert_eq!(user_copy_pos(0, 1, 0), 0x8000_0000 | 1 << 25);
        assert_eq!(user_copy_pos(1, 0, 512), 0x8000_0000 | 1 << 41 | 512);
        // Page size 4 KiB: 4096 descriptors of 24 bytes are 24 pages.
        assert_eq!(cmd_buf_stride(4096), 24 * 4096);
    }
}
