//! Teardown: [`QueuePair::close`] and `Drop`: delete the queues, end every
//! command once, free the rings and PRP pages or leak them while the device
//! may still access them.

use super::recover::stopped_error;
use super::*;

impl<B: IoBuf> QueuePair<B> {
    /// Delete the queues on the controller, deliver every completion the
    /// controller still posts, and complete every remaining command with
    /// [`IoError::Aborted`]: each submitted command completes exactly once.
    ///
    /// After a controller reset or failure the queues are already gone on
    /// the device: the commands complete as [`poll`](Self::poll) would
    /// complete them, and a failed controller is reported as `Err` (after
    /// every command was delivered).
    ///
    /// If deleting a queue fails (an error status, or an admin timeout
    /// under [`TimeoutPolicy::ReportOnly`]), the controller still owns the
    /// queue: the remaining commands complete with [`IoError::Aborted`] but
    /// without their buffers, which are leaked like the rings and PRP pages
    /// ([`Controller::leaked_bytes`]), and the queue id is not reused;
    /// the error is returned.
    ///
    /// A panic in `f` does not skip any of this: dropping the queue pair
    /// (as unwinding does) carries on from where `close` stopped, with the
    /// remaining completions dropped.
    pub fn close(mut self, mut f: impl FnMut(Completion<B>)) -> Result<()> {
        self.shut_down(&mut f)
    }

    /// Close or drop: resumable (see [`Teardown`]).
    pub(super) fn shut_down<F: FnMut(Completion<B>)>(&mut self, f: &mut F) -> Result<()> {
        loop {
            match self.teardown {
                Teardown::Done => return Ok(()),
                Teardown::Live => {
                    self.eng.held.deliver(usize::MAX, f);
                    if self.ctrl.state() != self.eng.seen_state {
                        let _ = self.recover(false, f);
                    }
                    if self.eng.stopped.is_some() || self.eng.queue_absent {
                        return self.shut_down_gone();
                    }
                    // Report every consumed CQE first: deleting the SQ may
                    // make the controller post completions for what it
                    // aborts, and they must find room (the lazy head could
                    // otherwise leave too little).
                    self.cq.flush();
                    match self.ctrl.delete_sq(self.qid) {
                        Ok(()) => self.teardown = Teardown::SqDeleted,
                        Err(e) => return self.delete_failed(f, e),
                    }
                }
                Teardown::SqDeleted => {
                    // The controller posts completions (often "aborted: SQ
                    // deletion") for what it fetched before deleting the SQ.
                    self.deliver_posted(f);
                    match self.ctrl.delete_cq(self.qid) {
                        Ok(()) => self.teardown = Teardown::Deleted,
                        Err(e) => return self.delete_failed(f, e),
                    }
                }
                Teardown::Deleted => {
                    // Both queues are gone: the device no longer accesses
                    // the buffers of what it never completed.
                    self.eng.end_all(IoError::Aborted, true, f);
                    self.teardown = Teardown::Done;
                    self.ctrl.release_qid(self.qid);
                    return Ok(());
                }
            }
        }
    }

    /// A reset or failure already removed the queues (`on_state_change`
    /// completed, or leaked, every command).
    pub(super) fn shut_down_gone(&mut self) -> Result<()> {
        self.teardown = Teardown::Done;
        // Free again even after a failure without a disable: the controller
        // must be reset before any queue can be created, and a reset deletes
        // every queue. Not when re-creating the queue after a reset may have
        // left it on the controller.
        if !(self.eng.stopped == Some(Stopped::Lost) && self.eng.device_may_access) {
            self.ctrl.release_qid(self.qid);
        }
        match self.eng.stopped {
            Some(e) => Err(stopped_error(e, self.qid)),
            None => Ok(()),
        }
    }

    /// Deleting a queue failed with `e`.
    #[cold]
    pub(super) fn delete_failed<F: FnMut(Completion<B>)>(
        &mut self,
        f: &mut F,
        e: Error,
    ) -> Result<()> {
        // The deletion may have failed because the controller was reset or
        // failed meanwhile: then complete as poll would.
        if self.ctrl.state() != self.eng.seen_state {
            let _ = self.recover(false, f);
            if self.eng.stopped.is_some() || self.eng.queue_absent {
                return self.shut_down_gone();
            }
        }
        // The controller still has the queue: it may fetch from the SQ ring
        // and PRP pages, transfer into the buffers, and post into the CQ
        // ring. None of it may be freed or reused: leak it all (the rings
        // and PRP pages in `Drop`), and keep the queue id out of use.
        self.eng.device_may_access = true;
        self.teardown = Teardown::Done;
        log::error!(
            "queue {}: deleting the queues failed ({e}); leaking its rings, PRP pages and {} in-flight buffers so the device cannot write into reused memory",
            self.qid,
            self.eng.trackers.outstanding()
        );
        let (_, leaked) = self.eng.end_all(IoError::Aborted, false, f);
        self.note_leak(leaked);
        Err(e)
    }
}

impl<B: IoBuf> Drop for QueuePair<B> {
    /// Delete the queues (completions of commands still in flight are
    /// dropped), then free the rings and PRP pages — or leak them if the
    /// device may still access them (see [`QueuePair::close`]).
    fn drop(&mut self) {
        if self.teardown != Teardown::Done {
            let _ = self.shut_down(&mut |c: Completion<B>| drop(c));
        }
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
