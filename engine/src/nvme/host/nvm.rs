//! The NVM command set's semantics every NVMe queue pair shares, whatever
//! carries the command: a request's namespace range checks, a failed
//! completion's status as an [`IoError`], a stopped queue's error.

use crate::core::error::Error;
use crate::core::io::{IoError, SubmitErrorKind};
use crate::core::state::Stopped;
use crate::core::timeout::Timeouts;
use crate::core::tracker::Trackers;
use crate::nvme::spec::status::{generic, sct};
use crate::nvme::spec::NvmeStatus;

/// The status a command aborted by an Abort command completes with.
pub(in crate::nvme) const ABORT_REQUESTED: NvmeStatus =
    NvmeStatus::new(sct::GENERIC, generic::ABORT_REQUESTED);

/// Check that `nlb` blocks from `slba` are a non-empty range inside a
/// namespace of `nsze` blocks: the refusal, if not.
#[inline]
pub(in crate::nvme) fn check_blocks(slba: u64, nlb: u32, nsze: u64) -> Result<(), SubmitErrorKind> {
    if nlb == 0 {
        return Err(SubmitErrorKind::ZeroLength);
    }
    match slba.checked_add(u64::from(nlb)) {
        Some(end) if end <= nsze => Ok(()),
        _ => Err(SubmitErrorKind::LbaOutOfRange {
            slba,
            nlb: u64::from(nlb),
            nsze,
        }),
    }
}

/// The error of a failed completion (of the command just completed in
/// `slot`, whose timeout state stays until it is armed again): a command
/// we aborted because it timed out reports [`IoError::TimedOut`], any
/// other status [`IoError::Nvme`].
#[cold]
pub(in crate::nvme) fn error_of<B>(
    timeouts: &mut Timeouts,
    trackers: &Trackers<B>,
    slot: u16,
    st: NvmeStatus,
) -> IoError {
    if st == ABORT_REQUESTED && timeouts.was_aborted(trackers, slot) {
        IoError::TimedOut
    } else {
        IoError::Nvme(st)
    }
}

/// The error of a stopped queue pair, in NVMe's words (a wire that knows
/// more, such as a lost connection, says that first).
pub(in crate::nvme) fn stopped_error(s: Stopped, qid: u16) -> Error {
    match s {
        Stopped::Fatal => Error::ControllerFatal,
        Stopped::Gone => Error::DeviceGone,
        Stopped::Lost => Error::QueueLost { qid },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_must_be_non_empty_and_end_inside_the_namespace() {
        assert_eq!(check_blocks(0, 8, 8), Ok(()));
        assert_eq!(check_blocks(7, 1, 8), Ok(()));
        assert_eq!(check_blocks(0, 0, 8), Err(SubmitErrorKind::ZeroLength));
        assert!(matches!(
            check_blocks(7, 2, 8),
            Err(SubmitErrorKind::LbaOutOfRange {
                slba: 7,
                nlb: 2,
                nsze: 8
            })
        ));
        assert!(matches!(
            check_blocks(u64::MAX, 1, u64::MAX),
            Err(SubmitErrorKind::LbaOutOfRange { .. })
        ));
    }
}
