//! Recovery of a [`UfsQueuePair`] after its controller changed state: a
//! host controller reset ([`UfsController::reset`]), a fatal controller,
//! a removed one. The controller's side (disable, bring-up again) is in
//! `ctrl/mod.rs` and `ctrl/bringup.rs`; this is what each queue pair does at its next poll.
//!
//! The controller's state word carries an epoch that advances only once
//! HCE = 0 was confirmed (or the device is gone): from then on the
//! controller has dropped every queue and command and accesses none of
//! their memory. So, on a new epoch, the queue pair
//!
//! 1. delivers what the controller completed before it stopped — MCQ: the
//!    completion entries from the host's CQ head up to the first cleared
//!    one (consumed entries are cleared, so older laps of the ring are not
//!    read; CQTP is not read, it may have been reset), each proven as
//!    `poll` proves it — its UCD address is the current one of a busy slot
//!    (`UcdSlice::command_of`), in every OCS case — or counted as stale;
//!    legacy: rung slots whose UTRD holds an OCS other than the host's
//!    pre-fill;
//! 2. completes every other command exactly once — with
//!    [`IoError::AbortedByReset`] after a reset, [`IoError::ControllerFailed`]
//!    after a failure — and hands its buffer back;
//! 3. after a reset, re-creates its hardware queue on the same rings (MCQ:
//!    SQ ring nullified first, queue enabled CQ before SQ, host positions
//!    where the controller's pointers stand; legacy: UTRLBA and UTRLRSR).
//!
//! Until step 3 the pair rings no doorbell ([`UfsQueuePair::submit`] and
//! `poll` compare the state word first). When the state changed but the
//! epoch did not — a failed controller that would not read HCE = 0 — the
//! device may still write the buffers: the commands end with
//! `ControllerFailed` and **no** buffer, and the pair's memory is leaked.
//!
//! Everything here is cold and runs in one call; what it ends beyond the
//! poll's `max` waits in the pair's held completions
//! (`core::deliver::Held`), which the next polls (and `close`) hand out
//! first — `poll` never delivers more than `max`.

use super::*;

impl<B: IoBuf> UfsQueuePair<B> {
    /// `poll` when completions are held, or the state word changed, or
    /// the pair failed: hand out held completions, then recover, at most
    /// `max` in all (the rest are held).
    #[cold]
    #[inline(never)]
    pub(super) fn poll_cold(
        &mut self,
        max: usize,
        f: &mut impl FnMut(Completion<B>),
    ) -> Result<usize> {
        let mut n = self.held.deliver(max, f);
        if self.failed.is_none() && self.ctrl.state() == self.seen_state {
            return Ok(n);
        }
        // Taken while recovery runs: `f` is only called before anything
        // new is held (the budget comes first), and older held ones are
        // not passed to `f` here, so a panicking `f` loses none.
        let mut held = std::mem::take(&mut self.held);
        let (r, k) = held.budgeted(max - n, f, |mut g| self.on_state_change(&mut g));
        self.held = held;
        n += k;
        r.map(|_| n)
    }

    /// The controller's state word differs from what this pair saw, or the
    /// pair is failed. See the module docs.
    #[cold]
    #[inline(never)]
    pub(super) fn on_state_change(&mut self, f: &mut impl FnMut(Completion<B>)) -> Result<usize> {
        let mut n = 0;
        loop {
            if self.ctrl.state() == self.seen_state {
                return match self.failed {
                    Some(h) => Err(health_error(h)),
                    None => Ok(n),
                };
            }
            // Waits for a reset in progress to finish.
            let settled = self.ctrl.settled_state();
            let failure = state::failure(settled);
            if state::epoch(settled) == state::epoch(self.seen_state) {
                // Failed without being disabled: the controller may still
                // access our rings, descriptors and buffers.
                n += self.deliver_posted(f);
                let ended = self.trackers.outstanding();
                let leaked = self.end_all(IoError::ControllerFailed, false, f);
                n += ended;
                self.forget_transport();
                if !self.leak {
                    self.leak = true;
                    log::error!(
                        "UFS queue pair: the controller could not be disabled; {ended} commands end without their buffers"
                    );
                }
                self.ctrl.add_leaked(leaked);
                self.failed = (failure != state::OK).then_some(failure);
                self.seen_state = settled;
                continue;
            }
            // New epoch: disabled (or gone) since; nothing of ours is in
            // use by the controller.
            n += self.deliver_posted(f);
            let err = if failure == state::OK {
                IoError::AbortedByReset
            } else {
                IoError::ControllerFailed
            };
            n += self.trackers.outstanding();
            self.end_all(err, true, f);
            self.forget_transport();
            self.seen_state = settled;
            if failure != state::OK {
                self.failed = Some(failure);
                continue;
            }
            match self.recreate(settled) {
                Ok(true) => {
                    // The controller dropped every command: slots retired
                    // by a failed timeout reset serve again.
                    self.trackers.unretire_all();
                    self.failed = None;
                    self.empty_polls = 0;
                    self.recoveries += 1;
                }
                // Reset again meanwhile: look again.
                Ok(false) => continue,
                Err(e) => {
                    // The queue may be (partly) enabled on our rings.
                    self.leak = true;
                    self.failed = Some(state::FATAL);
                    let qid = self.hw_queue().unwrap_or(0);
                    log::error!("UFS queue {qid}: re-creating the queue after a reset failed: {e}");
                    return Err(Error::QueueLost { qid });
                }
            }
        }
    }

    /// Step 1: deliver the commands the controller completed before it
    /// stopped. Returns how many completions were delivered.
    fn deliver_posted(&mut self, f: &mut impl FnMut(Completion<B>)) -> usize {
        let outstanding = self.trackers.outstanding();
        if outstanding == 0 {
            return 0;
        }
        let mut done: Vec<(u16, Ocs)> = Vec::new();
        match &mut *self.transport {
            Transport::Mcq(q) => {
                // The same proof as `poll`'s, whatever the OCS: the entry's
                // address is the current UCD of a busy slot, and the first
                // such entry for it (a duplicate is stale).
                let (trackers, ucds) = (&mut self.trackers, &*self.ucds);
                q.drain_posted(|ucd, ocs| {
                    let slot = ucds.command_of(ucd);
                    if usize::from(slot) >= trackers.slots()
                        || !trackers.slot(slot).busy
                        || done.iter().any(|&(s, _)| s == slot)
                    {
                        trackers.stale += 1;
                        return;
                    }
                    done.push((slot, ocs));
                });
            }
            Transport::Sdb(q) => {
                for (slot, ..) in self.trackers.busy() {
                    if let Some(ocs) = q.completed_before_reset(slot) {
                        done.push((slot, ocs));
                    }
                }
            }
        }
        let mut n = 0;
        for (slot, ocs) in done {
            n += self.finish_slot(slot, ocs, f);
        }
        n
    }

    /// Complete `slot` with the controller's `ocs` and its RESPONSE (the
    /// same decoding as `poll`). Returns the completions delivered (0 for
    /// a child of a split transfer whose siblings are still in flight).
    fn finish_slot(&mut self, slot: u16, ocs: Ocs, f: &mut impl FnMut(Completion<B>)) -> usize {
        let task_tag = self.tag_base.wrapping_add(slot as u8);
        let result = if ocs == Ocs::SUCCESS && self.ucds.response_head(slot).is_good(task_tag) {
            Ok(())
        } else {
            let timed_out = self.timeouts.was_aborted(&self.trackers, slot);
            failed_result(ocs, &self.ucds, slot, task_tag, timed_out)
        };
        let (tag, buf) = self.trackers.complete(slot);
        if end_internal(&mut self.hpb, &self.ucds, slot, &result) {
            return 0;
        }
        let Some(c) = deliver::route(&mut self.splits, slot, tag, buf, result, 0) else {
            return 0;
        };
        self.completed += 1;
        f(c);
        1
    }

    /// The transport's own record of what is in flight is void.
    fn forget_transport(&mut self) {
        if let Transport::Sdb(q) = &mut *self.transport {
            q.forget_outstanding();
        }
    }

    /// Step 3: re-create the hardware queue on the controller in state
    /// `settled`. `Ok(false)`: the state moved on meanwhile.
    fn recreate(&mut self, settled: u64) -> std::result::Result<bool, super::super::UfsCtrlError> {
        match &mut *self.transport {
            Transport::Mcq(q) => {
                q.nullify(Utrd::new(0, DataDir::None, 0).nullified());
                match self.ctrl.recreate_mcq_queue(settled, q.rings())? {
                    Some((regs, sq_tail, cq_head)) => {
                        q.restart(regs, sq_tail, cq_head);
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
            Transport::Sdb(_) => self.ctrl.restart_legacy_list(settled),
        }
    }

    /// Controller resets this queue pair recovered from (its queue
    /// re-created).
    pub fn recoveries(&self) -> u64 {
        self.recoveries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ufs::{HpbConfig, UfsOptions, UfsQpairOptions};
    use mcqio_fixtures::ufs::{
        FakeUfs, FtlConfig, HpbConfig as DevHpb, HpbControl as DevControl, LuConfig, UfsConfig,
        UfsFault,
    };

    /// Issue 27 item 4: an internal command the controller will not give
    /// up (withdrawal refused, no completion) is given up inside the queue
    /// pair: no completion reaches the application, `outstanding()` stays
    /// 0, its slot is retired and its mark cleared with it, so after a
    /// successful reset the slot carries an application command that
    /// completes (it was swallowed as internal before).
    #[test]
    fn a_given_up_internal_command_ends_inside_and_its_slot_serves_after_a_reset() {
        for mcq in [true, false] {
            let fake = FakeUfs::new(UfsConfig {
                exec: mcqio_fixtures::ExecMode::Sync,
                mcq,
                lus: vec![LuConfig::Sparse { blocks: 4096 }],
                ftl: Some(FtlConfig::default()),
                hpb: Some(DevHpb {
                    control: DevControl::Host,
                    region_size: 9,
                    subregion_size: 7,
                    max_active_regions: 16,
                    ..DevHpb::default()
                }),
                ..UfsConfig::default()
            })
            .expect("fake");
            let backend: Arc<dyn mcqio_vfio::Backend> = fake.clone();
            let ctrl = UfsController::new(
                backend,
                UfsOptions {
                    queues: 1,
                    depth: 8,
                    hpb: Some(HpbConfig {
                        activation_threshold: 2,
                        eviction_enter: 0,
                        eviction_exit: u32::MAX,
                        ..HpbConfig::default()
                    }),
                    ..UfsOptions::default()
                },
            )
            .expect("bring-up");
            let mut qp = ctrl
                .create_qpair_with::<DmaBuf>(UfsQpairOptions {
                    io_timeout: Some(Duration::from_millis(40)),
                    timeout_policy: crate::TimeoutPolicy::Reset,
                })
                .expect("qpair");
            let depth = qp.depth();
            fake.faults()
                .inject_next(None, Some(0xF9), UfsFault::DropCompletion);
            let mut v = vec![0u8; 4096];
            for _ in 0..3 {
                qp.read_blocking(0, 40, &mut v).expect("read");
            }
            let slot = (0..qp.trackers.slots() as u16)
                .find(|&s| qp.hpb.is_internal(s))
                .expect("a map load in flight");
            // As if its withdrawal had been refused.
            qp.hpb.withdrawn(slot, qp.timeouts.now_ms, false);
            let start = Instant::now();
            while qp.depth() == depth {
                qp.poll(8, |c| {
                    panic!("mcq={mcq}: the application got tag {}", c.tag)
                })
                .expect("poll");
                assert!(start.elapsed() < Duration::from_secs(10), "mcq={mcq}");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(!qp.hpb.is_internal(slot), "mcq={mcq}: mark cleared");
            assert_eq!((qp.outstanding(), qp.hpb.inflight()), (0, 0), "mcq={mcq}");
            let s = qp.stats();
            assert_eq!((s.timeouts, s.resets_requested), (0, 0), "mcq={mcq}");
            let h = ctrl.hpb_stats(0).expect("HPB");
            assert_eq!(
                (h.internal_timeouts, h.internal_given_up),
                (1, 1),
                "mcq={mcq}"
            );
            ctrl.reset().expect("reset");
            while qp.recoveries() == 0 {
                qp.poll(8, |c| {
                    panic!("mcq={mcq}: the application got tag {}", c.tag)
                })
                .expect("poll");
                assert!(start.elapsed() < Duration::from_secs(10), "mcq={mcq}");
            }
            assert_eq!(qp.depth(), depth, "mcq={mcq}");
            for i in 0..depth as u64 {
                let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buf");
                qp.read(0, 2000 + i, 1, b, i).expect("read");
            }
            qp.submit();
            let mut n = 0;
            while n < depth {
                n += qp
                    .poll(8, |c| {
                        assert!(c.result.is_ok(), "mcq={mcq}: {:?}", c.result)
                    })
                    .expect("poll");
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "mcq={mcq}: {n} of {depth}"
                );
            }
            // The given-up load's buffer (and the queue's memory, which the
            // device may have held meanwhile) are leaked, and counted.
            assert_eq!(ctrl.leaked_bytes(), 0, "mcq={mcq}");
            let hpb_bytes = qp.hpb.leaking_bytes();
            assert_eq!(hpb_bytes, 2 * 128, "mcq={mcq}: two 16-entry load buffers");
            drop(qp);
            assert_eq!(
                ctrl.leaked_bytes(),
                (depth * SLOT_BYTES) as u64 + hpb_bytes,
                "mcq={mcq}"
            );
        }
    }
}
