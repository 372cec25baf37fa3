//! Teardown: [`QueuePair::close`] and `Drop`: delete the queues, end every
//! command once, free the rings and PRP pages or leak them while the device
//! may still access them.

use super::{QueuePair, Teardown};
use crate::core::error::{Error, Result};
use crate::core::io::{Completion, IoBuf};
use crate::core::qpair::Lifecycle;
use crate::core::qpair::Wire;
use crate::core::state::Stopped;
use std::mem::ManuallyDrop;

impl<B: IoBuf> QueuePair<B> {
    /// Delete the queues on the controller, deliver every completion the
    /// controller still posts, and complete every remaining command with
    /// [`IoError::Aborted`](crate::core::io::IoError::Aborted): each submitted command completes exactly once.
    ///
    /// After a controller reset or failure the queues are already gone on
    /// the device: the commands complete as [`poll`](Self::poll) would
    /// complete them, and a failed controller is reported as `Err` (after
    /// every command was delivered).
    ///
    /// If deleting a queue fails (an error status, or an admin timeout
    /// under [`TimeoutPolicy::ReportOnly`](crate::core::timeout::TimeoutPolicy::ReportOnly)), the controller still owns the
    /// queue: the remaining commands complete with [`IoError::Aborted`](crate::core::io::IoError::Aborted) but
    /// without their buffers, which are leaked like the rings and PRP pages
    /// ([`Controller::leaked_bytes`](crate::nvme::Controller::leaked_bytes)), and the queue id is not reused;
    /// the error is returned.
    ///
    /// A panic in `f` does not skip any of this: dropping the queue pair
    /// (as unwinding does) carries on from where `close` stopped, with the
    /// remaining completions dropped.
    pub fn close(mut self, mut f: impl FnMut(Completion<B>)) -> Result<()> {
        self.shutdown(&mut f)
    }

    /// `Wire::withdraw_all`: delete the SQ, deliver what the controller
    /// posts for what it fetched before, delete the CQ. Resumable (see
    /// [`Teardown`]).
    pub(super) fn delete_queues(&mut self, f: &mut dyn FnMut(Completion<B>)) -> Result<bool> {
        loop {
            match self.teardown {
                Teardown::Live => {
                    // Report every consumed CQE first: deleting the SQ may
                    // make the controller post completions for what it
                    // aborts, and they must find room (the lazy head could
                    // otherwise leave too little).
                    self.cq.flush();
                    match self.ctrl.delete_sq(self.qid) {
                        Ok(()) => self.teardown = Teardown::SqDeleted,
                        Err(e) => return Err(self.delete_failed(e)),
                    }
                }
                Teardown::SqDeleted => {
                    // The controller posts completions (often "aborted: SQ
                    // deletion") for what it fetched before deleting the SQ.
                    self.deliver_posted(f);
                    match self.ctrl.delete_cq(self.qid) {
                        Ok(()) => self.teardown = Teardown::Deleted,
                        Err(e) => return Err(self.delete_failed(e)),
                    }
                }
                // Both queues are gone: the device no longer accesses the
                // buffers of what it never completed.
                Teardown::Deleted => return Ok(true),
            }
        }
    }

    /// Deleting a queue failed with `e`: unless a reset or failure explains
    /// it (the core then ends the rest as poll would), the controller still
    /// has the queue — it may fetch from the SQ ring and PRP pages,
    /// transfer into the buffers, post into the CQ ring. None of it may be
    /// freed or reused: the core leaks the buffers, `Drop` the rings and
    /// PRP pages, and the queue id stays out of use.
    #[cold]
    fn delete_failed(&mut self, e: Error) -> Error {
        if self.ctrl.state() == self.eng.seen_state {
            log::error!(
                "queue {}: deleting the queues failed ({e}); leaking its rings, PRP pages and {} in-flight buffers so the device cannot write into reused memory",
                self.qid,
                self.eng.trackers.outstanding()
            );
        }
        e
    }

    /// `Wire::closed`: the queue id goes back — unless the controller may
    /// still have the queue: a deletion that failed, or re-creating it
    /// after a reset that may have left it there. After a failure without
    /// a disable the id is free again all the same: the controller must be
    /// reset before any queue can be created, and a reset deletes every
    /// queue.
    pub(super) fn release_queue(&mut self, gone: bool) {
        let keep = if gone {
            self.eng.stopped == Some(Stopped::Lost) && self.eng.device_may_access
        } else {
            self.eng.device_may_access
        };
        if !keep {
            self.ctrl.release_qid(self.qid);
        }
    }
}

impl<B: IoBuf> Drop for QueuePair<B> {
    /// Delete the queues (completions of commands still in flight are
    /// dropped), then free the rings and PRP pages — or leak them if the
    /// device may still access them (see [`QueuePair::close`]).
    fn drop(&mut self) {
        let _ = self.shutdown(&mut drop);
        let ring_bytes = self.sq.region().len() + self.cq.region().len() + self.prp_mem.len();
        if self.eng.device_may_access {
            log::error!(
                "queue {}: the controller may still access its rings and PRP pages; leaking {ring_bytes} bytes",
                self.qid
            );
            self.ctrl.note_leak(ring_bytes as u64);
            return;
        }
        // SAFETY: each field is dropped exactly once, here, and `self` is
        // not used afterwards. The device no longer accesses this memory:
        // the queues were deleted, or the controller was disabled since (a
        // new epoch) or removed.
        unsafe {
            ManuallyDrop::drop(&mut self.sq);
            ManuallyDrop::drop(&mut self.cq);
            ManuallyDrop::drop(&mut self.prp_mem);
        }
    }
}
