//! Teardown: ending every command in flight once (`end_all`), `close`,
//! and `Drop`, which leaks the queue's memory when the controller may still
//! hold it.

use super::*;

impl<B: IoBuf> UfsQueuePair<B> {
    /// End every command in flight with `err` (the device no longer owns
    /// them, or `keep_bufs` is false and their buffers are leaked): HPB's
    /// own commands inside the HPB state, the application's once each
    /// (`Engine::end_all`). Returns the bytes leaked.
    #[cold]
    pub(super) fn end_all(
        &mut self,
        err: IoError,
        keep_bufs: bool,
        f: &mut dyn FnMut(Completion<B>),
    ) -> u64 {
        let leaked = self.end_internal(keep_bufs);
        leaked + self.eng.end_all(err, keep_bufs, f).1
    }

    /// Finish the queue pair: wait (up to `UfsOptions::close_timeout`) for
    /// commands in flight, then withdraw what is left (MCQ: SQ stop and
    /// cleanup by nexus; legacy: UTRLCLR). Every command ends exactly once
    /// through `f`: withdrawn ones with [`IoError::Aborted`] — with their
    /// buffer if the controller confirmed the withdrawal, without it
    /// (leaked, with the queue's memory) if not.
    pub fn close(mut self, mut f: impl FnMut(Completion<B>)) -> Result<()> {
        self.shutdown(&mut f);
        Ok(())
    }

    fn shutdown(&mut self, f: &mut dyn FnMut(Completion<B>)) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.eng.held.deliver(usize::MAX, &mut |c| f(c));
        let limit = self.ctrl.options().close_timeout;
        let start = Instant::now();
        while self.eng.trackers.outstanding() > 0
            && self.eng.stopped.is_none()
            && start.elapsed() < limit
        {
            if matches!(self.poll(usize::MAX, &mut *f), Ok(0)) {
                std::thread::yield_now();
            }
        }
        if self.eng.trackers.outstanding() == 0 {
            return;
        }
        // Still in flight: withdraw.
        let withdrawn = match &mut *self.transport {
            Transport::Sdb(q) => {
                let bits = q.clear_outstanding();
                let t = Instant::now();
                let mut left = q.still_set(bits);
                while left != 0 && t.elapsed() < limit {
                    std::thread::yield_now();
                    left = q.still_set(bits);
                }
                q.forget_outstanding();
                left == 0
            }
            Transport::Mcq(_) => {
                self.mcq_cleanup(limit, f);
                self.eng.trackers.outstanding() == 0
            }
        };
        let leaked = self.end_all(IoError::Aborted, withdrawn, f);
        if !withdrawn {
            self.eng.device_may_access = true;
            self.ctrl.add_leaked(leaked);
        }
    }
}

impl<B: IoBuf> Drop for UfsQueuePair<B> {
    fn drop(&mut self) {
        self.shutdown(&mut |_| {});
        // SAFETY: taken once, here; neither field is used after.
        let (t, u) = unsafe {
            (
                ManuallyDrop::take(&mut self.transport),
                ManuallyDrop::take(&mut self.ucds),
            )
        };
        if self.eng.device_may_access {
            self.hpb.leak_buffers();
        }
        // Counted once, here; `HpbQp`'s drop leaks them.
        self.ctrl.add_leaked(self.hpb.leaking_bytes());
        if self.eng.device_may_access {
            // The controller may still write these: never free or reuse them.
            self.ctrl
                .add_leaked((self.eng.trackers.slots() * SLOT_BYTES) as u64);
            std::mem::forget(u);
            std::mem::forget(t);
        } else if self.eng.stopped.is_none() {
            self.ctrl.give_back(t, Some(u));
        } else {
            drop(u.into_region());
        }
    }
}
