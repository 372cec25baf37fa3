//! UFS's hooks of the shared lifecycle (`core::qpair::Wire`): the
//! doorbell (`ring`), the completions (`reap`), the health look (IS), the
//! interrupt's arming, and the recovery of a [`UfsQueuePair`] after its
//! controller changed state: a host controller reset
//! ([`UfsController::reset`]), a fatal controller, a removed one. The controller's side (disable, bring-up again) is in
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
//! The state machine itself is the core's (`core::qpair::Lifecycle::recover`,
//! shared with every wire); this file holds UFS's hooks: what the controller
//! posted before it stopped, forgetting the legacy list's record,
//! re-creating the queue. What recovery ends beyond the poll's `max` waits
//! in the engine's held completions, which the next polls (and `close`)
//! hand out first — `poll` never delivers more than `max`.

use super::reap::finish;
use super::{stopped_error, HwQueue, UfsQueuePair, HEALTH_CHECK_INTERVAL};
use crate::core::error::{Error, Result};
use crate::core::io::{Completion, IoBuf};
use crate::core::qpair::Reaped as CoreReaped;
use crate::core::qpair::{Closing, Recreated, Wire};
use crate::core::state::Stopped;
use crate::ufs::ctrl::UfsController;
use crate::ufs::spec::utrd::{DataDir, Utrd};
use crate::ufs::ucd::UcdSlice;

impl<B: IoBuf> Wire for UfsQueuePair<B> {
    type Buf = B;
    type Ctrl = UfsController;
    type Child = u16;
    const HEALTH_CHECK_INTERVAL: u32 = HEALTH_CHECK_INTERVAL;

    crate::core::qpair::wire_parts!(eng, ctrl);

    fn accesses(&self) -> (u64, u64) {
        match &*self.hwq {
            HwQueue::Mcq(q) => (
                q.stats.sq_doorbell_writes + q.stats.cq_doorbell_writes,
                q.stats.cqtp_reads,
            ),
            HwQueue::Legacy(q) => (q.stats.doorbell_writes, q.stats.doorbell_reads),
        }
    }

    #[inline(always)]
    fn ring(&mut self) -> bool {
        self.hwq.flush()
    }

    #[inline(always)]
    fn reap<F: FnMut(Completion<B>)>(&mut self, max: usize, f: &mut F) -> CoreReaped {
        self.reap_entries(max, f)
    }

    #[cold]
    fn check_controller(&mut self) {
        self.ctrl.check_health();
    }

    /// Clear the line's notifier, then acknowledge and enable the queue's
    /// completion interrupt and unmask the line (`ctrl/irq.rs`).
    #[cold]
    fn arm_interrupt(&mut self) {
        if let Some(i) = &self.eng.wait.irq {
            i.clear();
        }
        let mcq = match &*self.hwq {
            HwQueue::Mcq(q) => {
                q.arm_interrupt();
                true
            }
            HwQueue::Legacy(_) => false,
        };
        self.ctrl
            .arm_interrupt(crate::ufs::ctrl::completion_cause(mcq));
    }

    #[cold]
    fn scan_timeouts(&mut self, drained: bool, f: &mut dyn FnMut(Completion<B>)) {
        // Only after a poll that reaped everything the controller had
        // posted: a command whose completion waits in the CQ is not a
        // timeout.
        if drained {
            self.scan_expired(f);
        }
    }

    #[inline(always)]
    fn after_poll(&mut self) {
        // No new map loads once the queue pair is closing.
        if self.hpb.pass_due() && self.eng.closing == Closing::Open {
            self.hpb_pass();
        }
    }

    /// Step 1: deliver the commands the controller completed before it
    /// stopped. MCQ: the same proof as `poll`'s, whatever the OCS — the
    /// entry's address is the current UCD of a busy slot, and the first
    /// such entry for it (its slot is free after that, so a duplicate is
    /// stale). Legacy: rung slots whose UTRD holds an OCS other than the
    /// host's pre-fill.
    fn deliver_posted(&mut self, f: &mut dyn FnMut(Completion<B>)) -> usize {
        if self.eng.trackers.outstanding() == 0 {
            return 0;
        }
        let mut f = f;
        let mut n = 0;
        let UfsQueuePair {
            hwq,
            eng,
            ucds,
            tag_base,
            hpb,
            ..
        } = self;
        let (ucds, tag_base): (&UcdSlice, u8) = (ucds, *tag_base);
        match &mut **hwq {
            HwQueue::Mcq(q) => {
                q.drain_posted(|ucd, ocs| {
                    if finish(eng, hpb, ucds, tag_base, ucds.command_of(ucd), ocs, &mut f) {
                        n += 1;
                    }
                });
            }
            HwQueue::Legacy(q) => {
                for slot in 0..eng.trackers.slots() as u16 {
                    if !eng.trackers.slot(slot).busy() {
                        continue;
                    }
                    if let Some(ocs) = q.completed_before_reset(slot) {
                        if finish(eng, hpb, ucds, tag_base, slot, ocs, &mut f) {
                            n += 1;
                        }
                    }
                }
            }
        }
        n
    }

    /// HPB's internal commands (map loads) are the HPB state's, not the
    /// application's: they end there, without a completion; application
    /// writes in flight dirty their sub-regions again.
    fn end_internal(&mut self, keep_bufs: bool) -> u64 {
        self.hpb.all_writes_ended();
        if self.hpb.inflight() > 0 {
            for slot in 0..self.eng.trackers.slots() as u16 {
                if self.eng.trackers.slot(slot).busy() && self.hpb.is_internal(slot) {
                    self.eng.trackers.complete(slot);
                    self.hpb.abandon(slot, keep_bufs);
                }
            }
        }
        0
    }

    /// The hwq's own record of what is in flight is void.
    fn forget(&mut self) {
        if let HwQueue::Legacy(q) = &mut *self.hwq {
            q.forget_outstanding();
        }
    }

    fn recreate(&mut self, settled: u64) -> Recreated {
        match self.recreate_queue(settled) {
            Ok(true) => Recreated::Yes(settled),
            Ok(false) => Recreated::Moved,
            Err(e) => Recreated::Failed {
                error: e.to_string(),
                // The queue may be (partly) enabled on our rings.
                left: true,
            },
        }
    }

    fn note_leak(&self, bytes: u64) {
        if bytes != 0 {
            self.ctrl.add_leaked(bytes);
        }
    }

    fn queue_id(&self) -> u16 {
        self.hw_queue().unwrap_or(0)
    }

    fn stopped_error(&self, s: Stopped) -> Error {
        stopped_error(s, self.queue_id())
    }

    fn withdraw_all(&mut self, f: &mut dyn FnMut(Completion<B>)) -> Result<bool> {
        self.withdraw_in_flight(f)
    }

    /// The queue's memory goes back to the pool (or is leaked) in `Drop`.
    fn closed(&mut self, _gone: bool) {}
}

impl<B: IoBuf> UfsQueuePair<B> {
    /// Step 3: re-create the hardware queue on the controller in state
    /// `settled`. `Ok(false)`: the state moved on meanwhile.
    fn recreate_queue(
        &mut self,
        settled: u64,
    ) -> std::result::Result<bool, crate::ufs::UfsCtrlError> {
        match &mut *self.hwq {
            HwQueue::Mcq(q) => {
                q.nullify(Utrd::new(0, DataDir::None, 0).nullified());
                match self.ctrl.recreate_mcq_queue(settled, q.rings())? {
                    Some((regs, sq_tail, cq_head)) => {
                        q.restart(regs, sq_tail, cq_head);
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
            HwQueue::Legacy(_) => self.ctrl.restart_legacy_list(settled),
        }
    }

    /// Controller resets this queue pair recovered from (its queue
    /// re-created).
    pub fn recoveries(&self) -> u64 {
        self.eng.rstats.recoveries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::io::DmaBuf;
    use crate::ufs::qpair::Arc;
    use crate::ufs::qpair::Duration;
    use crate::ufs::{HpbConfig, UfsOptions, UfsQpairOptions};
    use mcqio_fixtures::ufs::{
        FakeUfs, FtlConfig, HpbConfig as DevHpb, HpbControl as DevControl, LuConfig, UfsConfig,
        UfsFault,
    };
    use mcqio_vfio::DmaDir;
    use std::time::Instant;

    /// Issue 27 item 4: an internal command the controller will not give
    /// up (withdrawal refused, no completion) is given up inside the queue
    /// pair: no completion reaches the application, `outstanding()` stays
    /// 0, its slot is retired and its mark cleared with it, so after a
    /// successful reset the slot carries an application command that
    /// completes (it was swallowed as internal before).
    #[test]
    fn a_given_up_internal_command_ends_inside_and_its_slot_serves_after_a_reset() {
        // 6: a depth that is not a power of two (the tracker pads its
        // slots past it; HPB's per-slot state is as deep as the queue).
        for (mcq, want_depth) in [(true, 8u16), (false, 8), (true, 6), (false, 6)] {
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
                    depth: want_depth,
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
                .create_qpair_for::<DmaBuf>(UfsQpairOptions {
                    io_timeout: Some(Duration::from_millis(40)),
                    timeout_policy: crate::core::timeout::TimeoutPolicy::Reset,
                    ..Default::default()
                })
                .expect("qpair");
            let depth = qp.depth();
            fake.faults()
                .inject_next(None, Some(0xF9), UfsFault::DropCompletion);
            let mut v = vec![0u8; 4096];
            for _ in 0..3 {
                qp.read_blocking(0, 40, &mut v).expect("read");
            }
            let slot = (0..qp.eng.trackers.slots() as u16)
                .find(|&s| qp.hpb.is_internal(s))
                .expect("a map load in flight");
            // As if its withdrawal had been refused.
            qp.hpb.withdrawn(slot, qp.eng.timeouts.now_ms, false);
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
            // The given-up load's buffers are leaked, and counted. The
            // queue's memory is not: the reset's new epoch (HCE = 0
            // confirmed) means the controller dropped the command it may
            // have held, the state word's rule for every wire
            // (`core::state`).
            assert_eq!(ctrl.leaked_bytes(), 0, "mcq={mcq}");
            let hpb_bytes = qp.hpb.leaking_bytes();
            assert_eq!(hpb_bytes, 2 * 128, "mcq={mcq}: two 16-entry load buffers");
            drop(qp);
            assert_eq!(ctrl.leaked_bytes(), hpb_bytes, "mcq={mcq}");
        }
    }
}
