//! The 64-byte submission queue entry and command builders.
//!
//! Builders follow the io-uring crate's shape: required fields in `new`,
//! optional ones as `const fn` setters, and [`Command::sqe`] produces an
//! [`Sqe`] with no command identifier and no data pointer. The queue fills
//! those in ([`Sqe::with_cid`], [`Sqe::with_prp`]) when it submits, so a
//! builder can be reused and never sees queue internals.

use super::opcodes::{admin, cns, feature, nvm};
use mcqio_vfio::PlainData;

/// A submission queue entry (NVMe "Common Command Format"), 64 bytes.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Sqe {
    /// CDW0: opcode (bits 7:0), fused (9:8), PSDT (15:14), command id (31:16).
    pub cdw0: u32,
    /// Namespace identifier.
    pub nsid: u32,
    /// Command dword 2.
    pub cdw2: u32,
    /// Command dword 3.
    pub cdw3: u32,
    /// Metadata pointer.
    pub mptr: u64,
    /// Data pointer: PRP entry 1.
    pub prp1: u64,
    /// Data pointer: PRP entry 2 (or PRP list address).
    pub prp2: u64,
    /// Command dword 10.
    pub cdw10: u32,
    /// Command dword 11.
    pub cdw11: u32,
    /// Command dword 12.
    pub cdw12: u32,
    /// Command dword 13.
    pub cdw13: u32,
    /// Command dword 14.
    pub cdw14: u32,
    /// Command dword 15.
    pub cdw15: u32,
}

const _: () = assert!(std::mem::size_of::<Sqe>() == 64);
const _: () = assert!(std::mem::offset_of!(Sqe, prp1) == 24);
const _: () = assert!(std::mem::offset_of!(Sqe, cdw10) == 40);

// SAFETY: `Sqe` is `#[repr(C)]`, made only of integers, 64 bytes with no
// padding (asserted above), so every bit pattern is a valid value.
unsafe impl PlainData for Sqe {}

impl Sqe {
    /// An entry with just the opcode set.
    #[inline]
    pub const fn with_opcode(opcode: u8) -> Self {
        Sqe {
            cdw0: opcode as u32,
            nsid: 0,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            prp1: 0,
            prp2: 0,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }
    /// The opcode.
    #[inline]
    pub const fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }
    /// The command identifier.
    #[inline]
    pub const fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }
    /// Set the command identifier.
    #[inline]
    pub const fn with_cid(mut self, cid: u16) -> Self {
        self.cdw0 = (self.cdw0 & 0xFFFF) | (cid as u32) << 16;
        self
    }
    /// Set PRP1/PRP2 (PSDT = 0: PRPs).
    #[inline]
    pub const fn with_prp(mut self, prp1: u64, prp2: u64) -> Self {
        self.prp1 = prp1;
        self.prp2 = prp2;
        self
    }
    /// Set the namespace.
    #[inline]
    pub const fn with_nsid(mut self, nsid: u32) -> Self {
        self.nsid = nsid;
        self
    }
    /// Starting LBA of an NVM command (CDW10/11).
    #[inline]
    pub const fn slba(&self) -> u64 {
        self.cdw10 as u64 | (self.cdw11 as u64) << 32
    }
    /// Number of logical blocks of an NVM read/write (CDW12, as a count).
    #[inline]
    pub const fn nlb(&self) -> u32 {
        (self.cdw12 & 0xFFFF) + 1
    }
}

/// A command that can be encoded as an [`Sqe`].
pub trait Command {
    /// The opcode, from [`super::opcodes`].
    const OPCODE: u8;
    /// Encode without command id and data pointer (the queue adds them).
    fn sqe(&self) -> Sqe;
}

/// The most blocks one NVM read/write can carry (16-bit 0's based NLB).
pub const MAX_NLB: u32 = 1 << 16;

const FUA_BIT: u32 = 1 << 30;
const LR_BIT: u32 = 1 << 31;
const DEAC_BIT: u32 = 1 << 25;

#[inline]
const fn lba_cmd(opcode: u8, nsid: u32, slba: u64, nlb: u32, flags: u32) -> Sqe {
    let mut s = Sqe::with_opcode(opcode);
    s.nsid = nsid;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    // NLB is 0's based; a count of 0 is rejected before it gets here (the
    // queue pair validates), and wraps to the maximum if built directly.
    s.cdw12 = (nlb.wrapping_sub(1) & 0xFFFF) | flags;
    s
}

macro_rules! rw_builder {
    ($(#[$m:meta])* $name:ident, $op:expr) => {
        $(#[$m])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq)]
        pub struct $name {
            nsid: u32,
            slba: u64,
            nlb: u32,
            flags: u32,
        }
        impl $name {
            /// `nlb` logical blocks (a count, 1..=65536) starting at `slba`.
            #[inline]
            pub const fn new(nsid: u32, slba: u64, nlb: u32) -> Self {
                Self { nsid, slba, nlb, flags: 0 }
            }
            /// Force Unit Access.
            #[inline]
            pub const fn fua(mut self, on: bool) -> Self {
                if on { self.flags |= FUA_BIT } else { self.flags &= !FUA_BIT }
                self
            }
            /// Namespace.
            #[inline]
            pub const fn nsid(&self) -> u32 {
                self.nsid
            }
            /// Starting LBA.
            #[inline]
            pub const fn slba(&self) -> u64 {
                self.slba
            }
            /// Number of blocks (a count).
            #[inline]
            pub const fn nlb(&self) -> u32 {
                self.nlb
            }
            /// Limited Retry.
            #[inline]
            pub const fn limited_retry(mut self, on: bool) -> Self {
                if on { self.flags |= LR_BIT } else { self.flags &= !LR_BIT }
                self
            }
        }
        impl Command for $name {
            const OPCODE: u8 = $op;
            #[inline]
            fn sqe(&self) -> Sqe {
                lba_cmd(Self::OPCODE, self.nsid, self.slba, self.nlb, self.flags)
            }
        }
    };
}

rw_builder!(
    /// NVM Read.
    Read,
    nvm::READ
);
rw_builder!(
    /// NVM Write.
    Write,
    nvm::WRITE
);

/// NVM Flush (commit the volatile write cache).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Flush {
    nsid: u32,
}
impl Flush {
    /// Flush namespace `nsid` (`0xFFFF_FFFF`: all namespaces, if supported).
    pub const fn new(nsid: u32) -> Self {
        Self { nsid }
    }
}
impl Command for Flush {
    const OPCODE: u8 = nvm::FLUSH;
    fn sqe(&self) -> Sqe {
        Sqe::with_opcode(Self::OPCODE).with_nsid(self.nsid)
    }
}

/// NVM Write Zeroes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WriteZeroes {
    nsid: u32,
    slba: u64,
    nlb: u32,
    flags: u32,
}
impl WriteZeroes {
    /// Zero `nlb` blocks (a count) from `slba`.
    pub const fn new(nsid: u32, slba: u64, nlb: u32) -> Self {
        Self {
            nsid,
            slba,
            nlb,
            flags: 0,
        }
    }
    /// Deallocate: the controller may deallocate the blocks instead of writing.
    pub const fn deallocate(mut self, on: bool) -> Self {
        if on {
            self.flags |= DEAC_BIT
        } else {
            self.flags &= !DEAC_BIT
        }
        self
    }
    /// Force Unit Access.
    pub const fn fua(mut self, on: bool) -> Self {
        if on {
            self.flags |= FUA_BIT
        } else {
            self.flags &= !FUA_BIT
        }
        self
    }
}
impl Command for WriteZeroes {
    const OPCODE: u8 = nvm::WRITE_ZEROES;
    fn sqe(&self) -> Sqe {
        lba_cmd(Self::OPCODE, self.nsid, self.slba, self.nlb, self.flags)
    }
}

/// One Dataset Management range (16 bytes, in the command's data buffer).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DsmRange {
    /// Context attributes.
    pub cattr: u32,
    /// Length in logical blocks (a count, not 0's based).
    pub nlb: u32,
    /// Starting LBA.
    pub slba: u64,
}
const _: () = assert!(std::mem::size_of::<DsmRange>() == 16);
// SAFETY: `#[repr(C)]` integers, 16 bytes, no padding (asserted).
unsafe impl PlainData for DsmRange {}

/// The most ranges one Dataset Management command carries.
pub const DSM_MAX_RANGES: usize = 256;

/// NVM Dataset Management. The data buffer holds `ranges` [`DsmRange`]s.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DatasetManagement {
    nsid: u32,
    ranges: u16,
    attributes: u32,
}
impl DatasetManagement {
    /// Attribute: deallocate the ranges.
    pub const AD: u32 = 1 << 2;
    /// Attribute: integral dataset for write.
    pub const IDW: u32 = 1 << 1;
    /// Attribute: integral dataset for read.
    pub const IDR: u32 = 1 << 0;

    /// `ranges` ranges (1..=256), no attributes.
    pub const fn new(nsid: u32, ranges: u16) -> Self {
        Self {
            nsid,
            ranges,
            attributes: 0,
        }
    }
    /// Set the deallocate attribute (TRIM).
    pub const fn deallocate(mut self) -> Self {
        self.attributes |= Self::AD;
        self
    }
}
impl Command for DatasetManagement {
    const OPCODE: u8 = nvm::DATASET_MANAGEMENT;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE).with_nsid(self.nsid);
        s.cdw10 = (self.ranges as u32).wrapping_sub(1) & 0xFF;
        s.cdw11 = self.attributes;
        s
    }
}

/// Identify (admin).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Identify {
    cns: u8,
    nsid: u32,
    cntid: u16,
}
impl Identify {
    /// Identify Controller.
    pub const fn controller() -> Self {
        Self {
            cns: cns::CONTROLLER,
            nsid: 0,
            cntid: 0,
        }
    }
    /// Identify Namespace `nsid`.
    pub const fn namespace(nsid: u32) -> Self {
        Self {
            cns: cns::NAMESPACE,
            nsid,
            cntid: 0,
        }
    }
    /// Active namespace IDs greater than `after`.
    pub const fn active_namespaces(after: u32) -> Self {
        Self {
            cns: cns::ACTIVE_NS_LIST,
            nsid: after,
            cntid: 0,
        }
    }
    /// Any CNS value.
    pub const fn raw(cns: u8, nsid: u32) -> Self {
        Self {
            cns,
            nsid,
            cntid: 0,
        }
    }
}
impl Command for Identify {
    const OPCODE: u8 = admin::IDENTIFY;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE).with_nsid(self.nsid);
        s.cdw10 = self.cns as u32 | (self.cntid as u32) << 16;
        s
    }
}

/// Set Features (admin).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SetFeatures {
    fid: u8,
    value: u32,
    save: bool,
}
impl SetFeatures {
    /// Set feature `fid` to `value` (CDW11).
    pub const fn new(fid: u8, value: u32) -> Self {
        Self {
            fid,
            value,
            save: false,
        }
    }
    /// Number of Queues: `sq`/`cq` I/O queues wanted (counts, not 0's based).
    pub const fn number_of_queues(sq: u16, cq: u16) -> Self {
        Self::new(
            feature::NUMBER_OF_QUEUES,
            (sq.saturating_sub(1) as u32) | (cq.saturating_sub(1) as u32) << 16,
        )
    }
    /// Volatile Write Cache enable/disable.
    pub const fn volatile_write_cache(enable: bool) -> Self {
        Self::new(feature::VOLATILE_WRITE_CACHE, enable as u32)
    }
    /// Persist across power cycles.
    pub const fn save(mut self, on: bool) -> Self {
        self.save = on;
        self
    }
}
impl Command for SetFeatures {
    const OPCODE: u8 = admin::SET_FEATURES;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE);
        s.cdw10 = self.fid as u32 | (self.save as u32) << 31;
        s.cdw11 = self.value;
        s
    }
}

/// Get Features (admin).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GetFeatures {
    fid: u8,
}
impl GetFeatures {
    /// Read the current value of feature `fid`.
    pub const fn new(fid: u8) -> Self {
        Self { fid }
    }
}
impl Command for GetFeatures {
    const OPCODE: u8 = admin::GET_FEATURES;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE);
        s.cdw10 = self.fid as u32;
        s
    }
}

/// Create I/O Completion Queue (admin). PRP1 is the (contiguous) queue memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CreateIoCq {
    qid: u16,
    entries: u16,
    iv: u16,
    ien: bool,
}
impl CreateIoCq {
    /// A polled (no interrupt), physically contiguous CQ of `entries` entries.
    pub const fn new(qid: u16, entries: u16) -> Self {
        Self {
            qid,
            entries,
            iv: 0,
            ien: false,
        }
    }
    /// Enable interrupts on MSI-X vector `iv`.
    pub const fn interrupt(mut self, iv: u16) -> Self {
        self.iv = iv;
        self.ien = true;
        self
    }
}
impl Command for CreateIoCq {
    const OPCODE: u8 = admin::CREATE_IO_CQ;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE);
        s.cdw10 = self.qid as u32 | (self.entries.wrapping_sub(1) as u32) << 16;
        // PC (physically contiguous) = bit 0, IEN = bit 1, IV = 31:16.
        s.cdw11 = 1 | (self.ien as u32) << 1 | (self.iv as u32) << 16;
        s
    }
}

/// Create I/O Submission Queue (admin). PRP1 is the (contiguous) queue memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CreateIoSq {
    qid: u16,
    entries: u16,
    cqid: u16,
    prio: u8,
}
impl CreateIoSq {
    /// A physically contiguous SQ of `entries` entries completing to `cqid`.
    pub const fn new(qid: u16, entries: u16, cqid: u16) -> Self {
        Self {
            qid,
            entries,
            cqid,
            prio: 0,
        }
    }
    /// Queue priority for weighted round robin (0 urgent .. 3 low).
    pub const fn priority(mut self, prio: u8) -> Self {
        self.prio = prio & 0b11;
        self
    }
}
impl Command for CreateIoSq {
    const OPCODE: u8 = admin::CREATE_IO_SQ;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE);
        s.cdw10 = self.qid as u32 | (self.entries.wrapping_sub(1) as u32) << 16;
        s.cdw11 = 1 | (self.prio as u32) << 1 | (self.cqid as u32) << 16;
        s
    }
}

/// Delete I/O Submission Queue (admin).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeleteIoSq(pub u16);
impl Command for DeleteIoSq {
    const OPCODE: u8 = admin::DELETE_IO_SQ;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE);
        s.cdw10 = self.0 as u32;
        s
    }
}

/// Delete I/O Completion Queue (admin).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeleteIoCq(pub u16);
impl Command for DeleteIoCq {
    const OPCODE: u8 = admin::DELETE_IO_CQ;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE);
        s.cdw10 = self.0 as u32;
        s
    }
}

/// Abort (admin): abort command `cid` on submission queue `sqid`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Abort {
    sqid: u16,
    cid: u16,
}
impl Abort {
    /// Abort `cid` on `sqid`.
    pub const fn new(sqid: u16, cid: u16) -> Self {
        Self { sqid, cid }
    }
}
impl Command for Abort {
    const OPCODE: u8 = admin::ABORT;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE);
        s.cdw10 = self.sqid as u32 | (self.cid as u32) << 16;
        s
    }
}

/// Get Log Page (admin).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GetLogPage {
    lid: u8,
    nsid: u32,
    bytes: u32,
    offset: u64,
    rae: bool,
}
impl GetLogPage {
    /// Read `bytes` (a multiple of 4) of log `lid`.
    pub const fn new(lid: u8, bytes: u32) -> Self {
        Self {
            lid,
            nsid: 0xFFFF_FFFF,
            bytes,
            offset: 0,
            rae: false,
        }
    }
    /// Namespace scope.
    pub const fn nsid(mut self, nsid: u32) -> Self {
        self.nsid = nsid;
        self
    }
    /// Byte offset into the log.
    pub const fn offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }
    /// Retain Asynchronous Event.
    pub const fn retain_async_event(mut self, on: bool) -> Self {
        self.rae = on;
        self
    }
}
impl Command for GetLogPage {
    const OPCODE: u8 = admin::GET_LOG_PAGE;
    fn sqe(&self) -> Sqe {
        let mut s = Sqe::with_opcode(Self::OPCODE).with_nsid(self.nsid);
        let numd = (self.bytes / 4).saturating_sub(1);
        s.cdw10 = self.lid as u32 | (self.rae as u32) << 15 | (numd & 0xFFFF) << 16;
        s.cdw11 = numd >> 16;
        s.cdw12 = self.offset as u32;
        s.cdw13 = (self.offset >> 32) as u32;
        s
    }
}

/// Asynchronous Event Request (admin). Completes when an event occurs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct AsyncEventRequest;
impl Command for AsyncEventRequest {
    const OPCODE: u8 = admin::ASYNC_EVENT_REQUEST;
    fn sqe(&self) -> Sqe {
        Sqe::with_opcode(Self::OPCODE)
    }
}

/// Doorbell Buffer Config (admin): PRP1 = shadow doorbell page, PRP2 =
/// EventIdx page. Both are set by [`Sqe::with_prp`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DoorbellBufferConfig;
impl Command for DoorbellBufferConfig {
    const OPCODE: u8 = admin::DOORBELL_BUFFER_CONFIG;
    fn sqe(&self) -> Sqe {
        Sqe::with_opcode(Self::OPCODE)
    }
}
