//! What the server asks of the engine beyond [`BlockQueue`]: FUA writes
//! and Write Zeroes where the transport has them ([`Target`]), what the
//! device can do ([`Caps`], from what the engine reports), and how an
//! engine error becomes a block-layer errno ([`errno_of`],
//! [`refusal_errno`]).

use mcqio::core::block::BlockQueue;
use mcqio::nvme::spec::sqe::Write;
use mcqio::nvme::spec::status::{generic, media, sct};
use mcqio::nvme::tcp::TcpQueuePair;
use mcqio::ufs::UfsQueuePair;
use mcqio::{DmaBuf, IoError, QueuePair, SubmitError, SubmitErrorKind, UfsError};

/// A queue pair the server can drive: the block operations plus the two
/// NVMe-only ones. Statically dispatched, like [`BlockQueue`].
pub trait Target: BlockQueue<Buf = DmaBuf> {
    /// A write with Force Unit Access. Only called when [`Caps::fua`].
    fn write_fua(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: DmaBuf,
        tag: u64,
    ) -> Result<(), SubmitError<DmaBuf>>;

    /// Write Zeroes. Only called when [`Caps::write_zeroes_blocks`] > 0.
    fn write_zeroes(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>>;
}

impl Target for QueuePair<DmaBuf> {
    fn write_fua(
        &mut self,
        at: u32,
        lba: u64,
        blocks: u32,
        buf: DmaBuf,
        tag: u64,
    ) -> Result<(), SubmitError<DmaBuf>> {
        self.submit_write(Write::new(at, lba, blocks).fua(true), buf, tag)
    }

    fn write_zeroes(
        &mut self,
        at: u32,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        QueuePair::write_zeroes(self, at, lba, blocks, tag)
    }
}

/// NVMe/TCP: the engine's queue pair has neither (the server never
/// advertises them for it: see `device::caps_of`).
impl Target for TcpQueuePair<DmaBuf> {
    fn write_fua(
        &mut self,
        _at: u32,
        _lba: u64,
        _blocks: u32,
        buf: DmaBuf,
        _tag: u64,
    ) -> Result<(), SubmitError<DmaBuf>> {
        Err(SubmitError {
            kind: SubmitErrorKind::Unsupported("FUA writes over NVMe/TCP"),
            buf,
        })
    }

    fn write_zeroes(
        &mut self,
        _at: u32,
        _lba: u64,
        _blocks: u32,
        _tag: u64,
    ) -> Result<(), SubmitError<()>> {
        Err(SubmitError {
            kind: SubmitErrorKind::Unsupported("Write Zeroes over NVMe/TCP"),
            buf: (),
        })
    }
}

/// UFS: the engine has neither (the server never advertises them, so the
/// block layer emulates FUA with a flush and zeroes with writes).
impl Target for UfsQueuePair<DmaBuf> {
    fn write_fua(
        &mut self,
        _at: u8,
        _lba: u64,
        _blocks: u32,
        buf: DmaBuf,
        _tag: u64,
    ) -> Result<(), SubmitError<DmaBuf>> {
        Err(SubmitError {
            kind: SubmitErrorKind::Unsupported("FUA writes on UFS"),
            buf,
        })
    }

    fn write_zeroes(
        &mut self,
        _at: u8,
        _lba: u64,
        _blocks: u32,
        _tag: u64,
    ) -> Result<(), SubmitError<()>> {
        Err(SubmitError {
            kind: SubmitErrorKind::Unsupported("Write Zeroes on UFS"),
            buf: (),
        })
    }
}

/// What the device behind a ublk device can do, from what the engine
/// reports; it decides the parameters the kernel gets and which requests
/// the server may send on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    /// log2 of the logical block size.
    pub block_shift: u32,
    /// Capacity in logical blocks.
    pub blocks: u64,
    /// Bytes per request (the per-tag buffer; at most the engine's
    /// max transfer).
    pub max_io: u32,
    /// A volatile write cache: the kernel sends FLUSH.
    pub volatile_cache: bool,
    /// Writes may carry FUA (NVMe); otherwise the kernel emulates it with
    /// a flush.
    pub fua: bool,
    /// Deallocate / UNMAP.
    pub discard: bool,
    /// The device promises that deallocated blocks read back as zeroes
    /// (NVMe: [`dlfeat_reads_zeroes`]). Linux's block layer has no
    /// attribute for it, so the server only reports it; it is false
    /// wherever the engine does not report the promise (UFS: the engine
    /// does not read LBPRZ).
    pub discard_zeroes: bool,
    /// Most blocks one Write Zeroes may cover (0: none; the kernel then
    /// writes zeroes itself).
    pub write_zeroes_blocks: u32,
}

/// Whether an NVMe namespace whose Identify Namespace DLFEAT byte is
/// `dlfeat` promises zeroes from deallocated blocks: bits 2:0 = 001b.
/// 000b says nothing, 010b promises ones; the other values are reserved.
pub fn dlfeat_reads_zeroes(dlfeat: u8) -> bool {
    dlfeat & 0b111 == 0b001
}

/// How an I/O error the engine reports becomes the errno the ublk driver
/// turns into a block status (`errno_to_blk_status`): medium errors are
/// `-ENODATA` (BLK_STS_MEDIUM), capacity `-ENOSPC`, protection errors
/// `-EILSEQ`, a timeout `-ETIMEDOUT`, a dead link or controller
/// (NVMe/TCP: the queue pair's connection ended) `-ENOLINK`
/// (BLK_STS_TRANSPORT), everything else `-EIO`.
pub fn errno_of(e: &IoError) -> i32 {
    let n = match e {
        IoError::TimedOut => libc::ETIMEDOUT,
        IoError::ControllerFailed | IoError::ConnectionLost => libc::ENOLINK,
        IoError::Aborted | IoError::AbortedByReset => libc::EIO,
        IoError::Nvme(s) => match (s.sct, s.sc) {
            (sct::GENERIC, generic::CAPACITY_EXCEEDED) => libc::ENOSPC,
            (sct::GENERIC, generic::NAMESPACE_NOT_READY) => libc::EAGAIN,
            (sct::GENERIC, generic::INVALID_OPCODE | generic::INVALID_FIELD) => libc::EOPNOTSUPP,
            (sct::MEDIA, media::GUARD_CHECK..=0x84) => libc::EILSEQ,
            (sct::MEDIA, media::WRITE_FAULT | media::UNRECOVERED_READ) => libc::ENODATA,
            (sct::PATH, _) => libc::ENOLINK,
            _ => libc::EIO,
        },
        IoError::Ufs(u) => match u {
            UfsError::Transport(_) => libc::ENOLINK,
            UfsError::Scsi { sense: Some(s), .. } => match s.key {
                0x03 => libc::ENODATA,    // MEDIUM ERROR
                0x05 => libc::EOPNOTSUPP, // ILLEGAL REQUEST
                0x07 => libc::EIO,        // DATA PROTECT
                0x0d => libc::ENOSPC,     // VOLUME OVERFLOW
                _ => libc::EIO,
            },
            _ => libc::EIO,
        },
        _ => libc::EIO,
    };
    -n
}

/// Whether the engine says the command may simply be sent again (it was
/// aborted or reset away, or timed out and was aborted).
pub fn retriable(e: &IoError) -> bool {
    matches!(
        e,
        IoError::Aborted | IoError::AbortedByReset | IoError::TimedOut
    )
}

/// The errno for a submission the engine refused, or `None` when it only
/// has no room now (the request waits for a completion).
pub fn refusal_errno(k: &SubmitErrorKind) -> Option<i32> {
    let n = match k {
        SubmitErrorKind::QueueFull => return None,
        SubmitErrorKind::Unsupported(_) => libc::EOPNOTSUPP,
        SubmitErrorKind::ControllerFailed => libc::ENOLINK,
        SubmitErrorKind::LbaOutOfRange { .. } => libc::EIO,
        _ => libc::EIO,
    };
    Some(-n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcqio::NvmeStatus;

    #[test]
    fn only_dlfeat_001b_promises_zeroes() {
        // 001b, with and without bit 3 (Write Zeroes may deallocate) and
        // bit 4 (guard CRC of deallocated blocks): zeroes.
        for d in [0x01, 0x09, 0x11, 0x19] {
            assert!(dlfeat_reads_zeroes(d), "DLFEAT {d:#04x}");
        }
        // 000b (not reported), 010b (ones), 011b..111b (reserved).
        for d in [0x00, 0x02, 0x03, 0x05, 0x07, 0x08, 0x0a, 0x10] {
            assert!(!dlfeat_reads_zeroes(d), "DLFEAT {d:#04x}");
        }
    }

    #[test]
    fn engine_errors_become_block_errnos() {
        let nvme = |t, c| errno_of(&IoError::Nvme(NvmeStatus::new(t, c)));
        assert_eq!(nvme(sct::MEDIA, media::UNRECOVERED_READ), -libc::ENODATA);
        assert_eq!(nvme(sct::MEDIA, media::WRITE_FAULT), -libc::ENODATA);
        assert_eq!(nvme(sct::MEDIA, media::GUARD_CHECK), -libc::EILSEQ);
        assert_eq!(
            nvme(sct::GENERIC, generic::CAPACITY_EXCEEDED),
            -libc::ENOSPC
        );
        assert_eq!(nvme(sct::GENERIC, generic::DATA_TRANSFER_ERROR), -libc::EIO);
        assert_eq!(
            nvme(sct::GENERIC, generic::INVALID_OPCODE),
            -libc::EOPNOTSUPP
        );
        assert_eq!(errno_of(&IoError::TimedOut), -libc::ETIMEDOUT);
        assert_eq!(errno_of(&IoError::ControllerFailed), -libc::ENOLINK);
        assert_eq!(errno_of(&IoError::AbortedByReset), -libc::EIO);
        // NVMe/TCP: the queue pair's connection ended — a dead link, as
        // BLK_STS_TRANSPORT says, not a plain I/O error.
        assert_eq!(errno_of(&IoError::ConnectionLost), -libc::ENOLINK);
        assert!(!retriable(&IoError::ConnectionLost));
        assert!(retriable(&IoError::AbortedByReset));
        assert!(!retriable(&IoError::ControllerFailed));
        assert_eq!(refusal_errno(&SubmitErrorKind::QueueFull), None);
        assert_eq!(
            refusal_errno(&SubmitErrorKind::Unsupported("x")),
            Some(-libc::EOPNOTSUPP)
        );
    }
}
