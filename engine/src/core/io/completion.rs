//! How a command ends ([`Completion`], [`IoError`]) and how a submission
//! is refused ([`SubmitError`], [`SubmitErrorKind`]).

use std::fmt;

use mcqio_vfio::{DmaDir, Iova};

// The per-wire statuses are plain data of the transports' leaf `spec`
// modules (no transport machinery: `.ci/core-is-neutral`).
use crate::nvme::spec::status::NvmeStatus;
use crate::ufs::spec::status::UfsError;

/// How a command ended, when it did not succeed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The controller completed the command with an error status.
    #[error("controller returned {0}")]
    Nvme(NvmeStatus),
    /// The command was cancelled by the host (queue deletion, reset); it may be resubmitted.
    #[error(
        "command aborted by the host (queue deleted or controller reset); it may be resubmitted"
    )]
    Aborted,
    /// No completion arrived within the timeout. From [`crate::QueuePair::poll`]
    /// this means the command was aborted (the controller confirmed the Abort
    /// and posted the command's completion), so the device is done with the
    /// buffer; it may be resubmitted. From a blocking call it means the wait
    /// ended: the command stays owned by the queue until it completes, is
    /// aborted, or the queue is reset.
    #[error("no completion within the timeout (the command was aborted, or is still owned by the queue); it may be resubmitted")]
    TimedOut,
    /// The command was still outstanding when the controller was reset
    /// (by [`crate::Controller::reset`], or by a timeout policy). The reset
    /// disabled the controller first, so the device no longer accesses the
    /// buffer; the command may or may not have executed. Resubmit it.
    #[error(
        "command aborted by a controller reset (it may or may not have executed); resubmit it"
    )]
    AbortedByReset,
    /// A UFS command failed: transport status (OCS), target failure, or a
    /// SCSI status with sense data.
    #[error("UFS command failed: {0}")]
    Ufs(UfsError),
    /// The connection that carried the command (NVMe/TCP: one TCP
    /// connection per queue pair) ended before its completion arrived:
    /// the peer closed it, broke the protocol, or did not answer in time.
    /// No one can touch the buffer any more (a socket moves data only
    /// while the host sends and receives), so it comes back; the command
    /// may or may not have executed. The queue pair's `poll` reports why.
    #[error("the connection carrying the command ended; it may or may not have executed")]
    ConnectionLost,
    /// The controller failed (NVMe: CSTS.CFS; UFS: a fatal error bit in
    /// IS) or disappeared.
    #[error("the controller failed or was removed; reset the controller (fatal status) or re-attach the device (removal)")]
    ControllerFailed,
}

/// Why a submission was rejected. Nothing was sent to the device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitErrorKind {
    /// Every tracker is busy: poll completions, then resubmit.
    #[error("queue full: poll for completions, then resubmit")]
    QueueFull,
    /// A zero-block or zero-byte request.
    #[error("zero-length request")]
    ZeroLength,
    /// The LBA range runs past the end of the namespace (NVMe) or logical
    /// unit (UFS).
    #[error("LBAs {slba}..{slba}+{nlb} run past the last block ({nsze} blocks)")]
    LbaOutOfRange {
        /// Starting LBA.
        slba: u64,
        /// Blocks.
        nlb: u64,
        /// Namespace (logical unit) size in blocks.
        nsze: u64,
    },
    /// The buffer holds fewer bytes than the transfer needs.
    #[error("buffer has {available} bytes but the transfer needs {needed}")]
    BufferTooSmall {
        /// Bytes needed (blocks × block size).
        needed: u64,
        /// Bytes in the buffer.
        available: u64,
    },
    /// A segment breaks the transport's alignment rules: NVMe's PRP rules
    /// (module docs), UFS's PRDT rule (dword-aligned address and length).
    #[error("buffer segment {segment} at IOVA {iova} breaks the alignment the transport needs (NVMe PRPs: first segment 4-byte aligned, later ones starting and all but the last ending on a page; UFS PRDT: dword-aligned address and length)")]
    Misaligned {
        /// Segment index.
        segment: usize,
        /// Its IOVA.
        iova: Iova,
    },
    /// The buffer is not mapped in this controller's DMA space.
    #[error(
        "buffer is not DMA-mapped for this controller: allocate it from the controller's DMA space"
    )]
    NotDmaMapped,
    /// The buffer's mapping does not allow the transfer's direction.
    #[error("buffer is mapped {mapped:?} but the command needs the device to {needs}")]
    WrongDirection {
        /// How it is mapped.
        mapped: DmaDir,
        /// What the command needs.
        needs: &'static str,
    },
    /// No active namespace (NVMe) or logical unit (UFS: `nsid` is the LUN)
    /// with this id.
    #[error("{nsid} names no active namespace of this controller")]
    UnknownNamespace {
        /// The id given.
        nsid: u32,
    },
    /// UFS: no usable logical unit has this LUN.
    #[error("LUN {lun} names no logical unit of this UFS device")]
    UnknownLun {
        /// The LUN given.
        lun: u8,
    },
    /// The transfer cannot be carried even split into child commands: it
    /// needs more children than the queue depth, or one block is larger
    /// than the per-command limit (a read or write above the limit is
    /// otherwise split; see [`crate::QueuePair`]). Also for Write Zeroes
    /// above 65536 blocks, which is never split.
    #[error("transfer of {bytes} bytes exceeds the maximum of {max} bytes this queue can carry (split into at most its depth of commands); use smaller transfers or a deeper queue")]
    TransferTooLarge {
        /// Bytes asked for (blocks, for Write Zeroes).
        bytes: u64,
        /// The most this queue accepts.
        max: u64,
    },
    /// Dataset Management with no ranges or more than 256.
    #[error("{count} ranges given; a Dataset Management command takes 1 to 256")]
    BadRangeCount {
        /// Ranges given.
        count: usize,
    },
    /// The controller does not support this command (ONCS).
    #[error("the controller does not support {0}")]
    Unsupported(&'static str),
    /// The controller has failed; no more commands are accepted.
    #[error("the controller has failed; no more commands are accepted")]
    ControllerFailed,
}

/// A rejected submission: why, and the payload handed back untouched.
///
/// It is a [`std::error::Error`] for any payload (its message is the
/// kind's), so `?` can turn it into a `Box<dyn Error + Send + Sync>` when
/// the payload is `Send + Sync + 'static` (a [`DmaBuf`](crate::core::io::DmaBuf) is); to keep the
/// buffer, take it back with [`into_buf`](Self::into_buf) first, or map the
/// error to its [`kind`](Self::kind).
pub struct SubmitError<T> {
    /// Why it was rejected.
    pub kind: SubmitErrorKind,
    /// The buffer (or `()` for commands without one), returned to the caller.
    pub buf: T,
}

impl<T> SubmitError<T> {
    /// Take the payload back.
    pub fn into_buf(self) -> T {
        self.buf
    }
}

impl<T> fmt::Debug for SubmitError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitError")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for SubmitError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.kind, f)
    }
}

impl<T> std::error::Error for SubmitError<T> {}

/// A finished command.
#[derive(Debug)]
pub struct Completion<B> {
    /// The tag given at submission.
    pub tag: u64,
    /// Success, or how it failed.
    pub result: Result<(), IoError>,
    /// The data buffer, handed back (`None` for commands without one).
    pub buf: Option<B>,
    /// Command-specific result dword 0.
    pub dw0: u32,
}
