//! Teardown, UFS's side of the core's `Lifecycle::shutdown`: `close`, the
//! withdrawal of what is still in flight, and `Drop`, which leaks the
//! queue's memory when the controller may still hold it.

use super::{HwQueue, UfsQueuePair};
use crate::core::error::Result;
use crate::core::io::{Completion, IoBuf};
use crate::core::qpair::Lifecycle;
use crate::ufs::ucd::SLOT_BYTES;
use std::mem::ManuallyDrop;
use std::time::Instant;

impl<B: IoBuf> UfsQueuePair<B> {
    /// Finish the queue pair: wait (up to `UfsOptions::close_timeout`) for
    /// commands in flight, then withdraw what is left (MCQ: SQ stop and
    /// cleanup by nexus; legacy: UTRLCLR). Every command ends exactly once
    /// through `f`: withdrawn ones with [`IoError::Aborted`](crate::core::io::IoError::Aborted) — with their
    /// buffer if the controller confirmed the withdrawal, without it
    /// (leaked, with the queue's memory) if not. After a host controller
    /// reset or failure the commands end as [`poll`](Self::poll) ends them,
    /// and a failed controller is reported as `Err` once every command was
    /// delivered — the core's `Lifecycle::shutdown`, as on NVMe.
    pub fn close(mut self, mut f: impl FnMut(Completion<B>)) -> Result<()> {
        self.shutdown(&mut f)
    }

    /// `Wire::withdraw_all`: wait (up to `UfsOptions::close_timeout`) for
    /// the commands in flight, polling; then withdraw what is left (MCQ:
    /// SQ stop and cleanup by nexus, the ABORTED completions delivered as
    /// [`IoError::Aborted`]; legacy: UTRLCLR, waited for). `Ok(true)` when
    /// the controller holds none of them any more.
    pub(super) fn withdraw_in_flight(&mut self, f: &mut dyn FnMut(Completion<B>)) -> Result<bool> {
        let limit = self.ctrl.options().close_timeout;
        let start = Instant::now();
        while self.eng.trackers.outstanding() > 0
            && self.eng.stopped.is_none()
            && self.ctrl.state() == self.eng.seen_state
            && start.elapsed() < limit
        {
            if matches!(self.poll(usize::MAX, &mut *f), Ok(0)) {
                std::thread::yield_now();
            }
        }
        if self.eng.trackers.outstanding() == 0
            || self.eng.stopped.is_some()
            || self.ctrl.state() != self.eng.seen_state
        {
            // Done, or the core ends the rest as recovery does.
            return Ok(true);
        }
        // Still in flight: withdraw.
        let withdrawn = match &mut *self.hwq {
            HwQueue::Legacy(q) => {
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
            HwQueue::Mcq(_) => {
                self.mcq_cleanup(limit, f);
                self.eng.trackers.outstanding() == 0
            }
        };
        Ok(withdrawn)
    }
}

impl<B: IoBuf> Drop for UfsQueuePair<B> {
    fn drop(&mut self) {
        let _ = self.shutdown(&mut drop);
        // SAFETY: taken once, here; neither field is used after.
        let (t, u) = unsafe {
            (
                ManuallyDrop::take(&mut self.hwq),
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
            // The descriptors allocated, one per slot of the depth (the
            // tracker's slots are padded past it).
            self.ctrl.add_leaked((u.slots() * SLOT_BYTES) as u64);
            std::mem::forget(u);
            std::mem::forget(t);
        } else if self.eng.stopped.is_none() {
            self.ctrl.give_back(t, Some(u));
        } else {
            drop(u.into_region());
        }
    }
}
