//! Completion: [`QueuePair::poll`], CQE to tracker (CID = slot |
//! generation), stale CQEs dropped and counted.

use super::QueuePair;
use crate::core::error::Result;
use crate::core::io::{Completion, IoBuf, IoError};
use crate::core::qpair::Lifecycle;
use crate::core::qpair::Reaped;
use crate::core::timeout::Timeouts;
use crate::core::tracker::Trackers;
use crate::nvme::host::nvm;
use crate::nvme::spec::{Cqe, NvmeStatus};

impl<B: IoBuf> QueuePair<B> {
    /// Ring pending submissions, then deliver up to `max` completions (and at
    /// most the queue's `max_completions_per_poll`) to `f`, then write the CQ
    /// head doorbell once. Returns how many completions were delivered.
    ///
    /// Also where recovery happens (cold paths, off the per-I/O path): a
    /// controller reset since the last poll completes every outstanding
    /// command ([`IoError::AbortedByReset`]) and re-creates the queues; the
    /// timeout scan runs when due ([`QpairOptions::io_timeout`](crate::nvme::QpairOptions::io_timeout)).
    ///
    /// `max` is honoured on every path, recovery included: `poll(0)`
    /// delivers nothing (it rings pending submissions), and the completions
    /// a reset or failure produces are spread over as many polls as `max`
    /// requires (the queue is re-created once they are all delivered).
    ///
    /// `Err` means the controller failed ([`Error::ControllerFatal`](crate::core::error::Error::ControllerFatal)) or
    /// disappeared ([`Error::DeviceGone`](crate::core::error::Error::DeviceGone)) — checked from time to time while
    /// commands are outstanding and nothing completes — or this queue could
    /// not be re-created after a reset ([`Error::QueueLost`](crate::core::error::Error::QueueLost)). Every
    /// outstanding command has then been completed (with
    /// [`IoError::ControllerFailed`]), and later calls fail the same way
    /// until a successful [`Controller::reset`](crate::nvme::Controller::reset).
    #[inline]
    pub fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        Lifecycle::poll(self, max, &mut f)
    }

    /// The reaping pass of `poll` (the wire's `Wire::reap`): up to `max`
    /// CQEs, each matched to its command by CID and queue id, then the CQ
    /// head doorbell (lazily, see `CompQueue::flush_lazy`) — or, on rings
    /// with room for it, at the next ring after the SQ tail (`Wire::ring`,
    /// which every poll calls before it reaps).
    #[inline(always)]
    pub(super) fn reap_cqes<F: FnMut(Completion<B>)>(&mut self, max: usize, f: &mut F) -> Reaped {
        // The CQEs that delivered nothing (stale, a split's child) are
        // counted instead of those delivered: they leave the loop on cold
        // paths, so a delivering CQE moves one counter, not two.
        let mut undelivered = 0;
        let mut seen = 0;
        while seen < max {
            let Some(cqe) = self.cq.peek() else { break };
            self.cq.advance();
            self.cq.prefetch_next();
            seen += 1;
            self.sq.head = cqe.sq_head;
            if !self.take_cqe(cqe, f) {
                undelivered += 1;
            }
        }
        let delivered = seen - undelivered;
        if !self.cq_head_after_sq {
            self.cq.flush_lazy(self.cq_head_batch);
        }
        Reaped {
            seen,
            delivered,
            suspect: false,
        }
    }

    /// Match a CQE to its command and end it (`Engine::complete`), or
    /// count it as stale when it matches nothing in flight. Returns whether
    /// a completion was delivered.
    #[inline(always)]
    pub(super) fn take_cqe<F: FnMut(Completion<B>)>(&mut self, cqe: Cqe, f: &mut F) -> bool {
        // The queue id first, on its own: tested after the lookup, it was
        // kept as a flag across it.
        if cqe.sq_id != self.qid {
            self.stale(cqe.cid, cqe.sq_id, cqe.status);
            return false;
        }
        match self.eng.trackers.lookup(cqe.cid) {
            // A success built as a constant into the callback's argument:
            // a result decided inside `complete` went through memory with
            // its error's bytes.
            Some(slot) if NvmeStatus::raw_is_success(cqe.status) => {
                self.eng
                    .complete(slot, cqe.dw0, |_, _| Ok(()), |_, _| false, f)
            }
            Some(slot) => self.take_failed(slot, cqe.dw0, cqe.status, f),
            None => {
                self.stale(cqe.cid, cqe.sq_id, cqe.status);
                false
            }
        }
    }

    /// End the command in `slot` whose CQE (DW0 `dw0`, status halfword
    /// `status`) reports an error. The cold calls take the CQE's fields,
    /// not the entry: a 16-byte struct is passed through memory, and the
    /// hot path stored every CQE for them.
    #[cold]
    #[inline(never)]
    fn take_failed<F: FnMut(Completion<B>)>(
        &mut self,
        slot: u16,
        dw0: u32,
        status: u16,
        f: &mut F,
    ) -> bool {
        self.eng.complete(
            slot,
            dw0,
            |timeouts, trackers| Err(error_of(timeouts, trackers, slot, status)),
            |_, _| false,
            f,
        )
    }

    /// Count and log a CQE (its CID, SQ id and status halfword) that
    /// matches no command in flight.
    #[cold]
    #[inline(never)]
    pub(super) fn stale(&mut self, cid: u16, sq_id: u16, status: u16) {
        self.eng.trackers.stale += 1;
        log::warn!(
            "queue {}: dropped stale/duplicate completion (cid {cid:#06x}, sq {sq_id}, status {status:#06x})",
            self.qid,
        );
    }
}

/// The error of a failed completion whose CQE status halfword is
/// `status` (see `host::nvm::error_of`).
#[cold]
fn error_of<B: IoBuf>(
    timeouts: &mut Timeouts,
    trackers: &Trackers<B>,
    slot: u16,
    status: u16,
) -> IoError {
    nvm::error_of(
        timeouts,
        trackers,
        slot,
        NvmeStatus::from_cqe_status(status),
    )
}
