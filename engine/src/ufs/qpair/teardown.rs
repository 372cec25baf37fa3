//! Teardown: ending every command in flight once (`end_all`), `close`,
//! and `Drop`, which leaks the queue's memory when the controller may still
//! hold it.

use super::*;

impl<B: IoBuf> UfsQueuePair<B> {
    /// End every command in flight with `err` (the device no longer owns
    /// them, or `keep_bufs` is false and their buffers are leaked), children
    /// of a split through their parent (the shared `core::deliver`).
    /// Returns the bytes leaked.
    #[cold]
    pub(super) fn end_all(
        &mut self,
        err: IoError,
        keep_bufs: bool,
        f: &mut impl FnMut(Completion<B>),
    ) -> u64 {
        let mut leaked = 0u64;
        self.hpb.all_writes_ended();
        // Internal commands (HPB map loads) are the HPB state's, not the
        // application's: they end there, without a completion.
        if self.hpb.inflight() > 0 {
            let hpb = &self.hpb;
            let internal: Vec<u16> = self
                .trackers
                .busy()
                .map(|(slot, ..)| slot)
                .filter(|&slot| hpb.is_internal(slot))
                .collect();
            for slot in internal {
                self.trackers.complete(slot);
                self.hpb.abandon(slot, keep_bufs);
            }
        }
        let completed = &mut self.completed;
        drain_all(
            &mut self.trackers,
            &mut self.splits,
            usize::MAX,
            |tag, buf, first| {
                let buf = if keep_bufs {
                    buf
                } else {
                    leaked += deliver::leak(buf);
                    None
                };
                // Counted before the callback runs: it may panic.
                *completed += 1;
                f(Completion {
                    tag,
                    result: Err(first.unwrap_or(err)),
                    buf,
                    dw0: 0,
                });
            },
        );
        leaked + self.splits.take_leaked()
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

    fn shutdown(&mut self, f: &mut impl FnMut(Completion<B>)) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.held.deliver(usize::MAX, f);
        let limit = self.ctrl.options().close_timeout;
        let start = Instant::now();
        while self.trackers.outstanding() > 0 && self.failed.is_none() && start.elapsed() < limit {
            if matches!(self.poll(usize::MAX, &mut *f), Ok(0)) {
                std::thread::yield_now();
            }
        }
        if self.trackers.outstanding() == 0 {
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
                self.trackers.outstanding() == 0
            }
        };
        let leaked = self.end_all(IoError::Aborted, withdrawn, f);
        if !withdrawn {
            self.leak = true;
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
        if self.leak {
            self.hpb.leak_buffers();
        }
        // Counted once, here; `HpbQp`'s drop leaks them.
        self.ctrl.add_leaked(self.hpb.leaking_bytes());
        if self.leak {
            // The controller may still write these: never free or reuse them.
            self.ctrl
                .add_leaked((self.trackers.slots() * SLOT_BYTES) as u64);
            std::mem::forget(u);
            std::mem::forget(t);
        } else if self.failed.is_none() {
            self.ctrl.give_back(t, Some(u));
        } else {
            drop(u.into_region());
        }
    }
}
