//! Timeouts and withdrawal, UFS's side: the timeout scan (application and HPB internal
//! commands), the escalation to the controller-reset hook, MCQ cleanup by
//! nexus, UTRLCLR, `check_timeouts`, `check_health` and `abort`.

use super::{stopped_error, HwQueue, UfsQueuePair};
use crate::core::error::{Error, Result};
use crate::core::io::{Completion, IoBuf, IoError};
use crate::core::qpair::Wire;
use crate::core::split_table::Routed;
use crate::core::state::Stopped;
use crate::core::timeout::{Expired, Outstanding, TimeoutActions, Timeouts};
use crate::core::tracker::Trackers;
use crate::core::{deliver, timeout};
use crate::ufs::ctrl::{state, UfsController};
use crate::ufs::hpb::qp::Overdue;
use crate::ufs::spec::regs::sq_op;
use crate::ufs::spec::status::UfsError;
use crate::ufs::spec::utrd::Ocs;
use std::time::{Duration, Instant};

impl UfsController {
    /// The timeout policy's escalation hook: reset the host controller
    /// because a command did not complete and could not be withdrawn
    /// (policy [`TimeoutPolicy::Reset`], or an abort that was refused or
    /// not answered). Returns whether a reset happened — it then ends every
    /// command in flight, on every queue pair, the way any reset does.
    ///
    /// When the reset fails (a controller that cannot be disabled), the
    /// queue pair ends the command without its buffer (see
    /// [`UfsQueuePair`]).
    #[cold]
    pub(crate) fn reset_for_timeout(&self) -> bool {
        match self.reset() {
            Ok(()) => true,
            Err(e) => {
                log::error!(
                    "{}: reset after a command timeout failed: {e}",
                    self.backend().name()
                );
                false
            }
        }
    }
}

impl<B: IoBuf> UfsQueuePair<B> {
    /// Act on commands past their timeout (see [`TimeoutPolicy`]): the
    /// core finds them and decides, the UFS abort machinery acts. Cold.
    #[cold]
    #[inline(never)]
    pub(super) fn scan_expired(&mut self, f: &mut dyn FnMut(Completion<B>)) {
        // Nothing is marked posted: the scan runs only after a poll that
        // reaped everything posted.
        self.eng.timeouts.begin_scan();
        // HPB's internal commands are not the application's: its policy and
        // statistics never see them; they have their own handling below.
        if self.hpb.inflight() > 0 {
            for slot in 0..self.eng.trackers.slots() as u16 {
                if self.hpb.is_internal(slot) {
                    self.eng.timeouts.exclude(slot);
                }
            }
        }
        timeout::scan(&mut UfsTimeouts { qp: self, f });
        if self.eng.stopped.is_none() && self.ctrl.state() == self.eng.seen_state {
            self.scan_internal_timeouts();
        }
    }

    /// HPB's internal commands past the I/O timeout: withdrawn (MCQ cleanup
    /// by nexus, UTRLCLR) once, whatever the application's policy, so that
    /// its ABORTED completion ends it as a failed command inside the queue
    /// pair; given up (slot retired until a controller reset, buffer never
    /// reused) if the controller refuses, or does not give it back within
    /// another timeout. Never a controller reset, never in
    /// [`UfsQpairStats`]: counted in [`HpbStats`](crate::ufs::HpbStats).
    #[cold]
    fn scan_internal_timeouts(&mut self) {
        if self.hpb.inflight() == 0 {
            return;
        }
        let (now, limit, scan) = (
            self.eng.timeouts.now_ms,
            self.eng.timeouts.timeout_ms(),
            self.eng.timeouts.scan_interval_ms(),
        );
        for slot in 0..self.eng.trackers.slots() as u16 {
            let s = self.eng.trackers.slot(slot);
            if !s.busy() {
                continue;
            }
            match self
                .hpb
                .timeout_step(slot, s.submitted_ms, now, limit, scan)
            {
                None => continue,
                Some(Overdue::Withdraw) => {
                    log::warn!(
                        "UFS queue pair (tag base {}): HPB command in slot {slot} has no completion after {} ms; withdrawing it",
                        self.tag_base,
                        now.wrapping_sub(s.submitted_ms)
                    );
                    let accepted = self.withdraw(slot).unwrap_or(false);
                    self.hpb.withdrawn(slot, now, accepted);
                }
                Some(Overdue::GiveUp) => self.give_up_internal(slot),
            }
            if self.eng.stopped.is_some() || self.ctrl.state() != self.eng.seen_state {
                return;
            }
        }
    }

    /// End the internal command in busy `slot` that the controller may
    /// still hold: its slot is retired (never reused until a controller
    /// reset succeeds), and the queue's memory leaked at drop. No
    /// completion: it is not the application's.
    #[cold]
    fn give_up_internal(&mut self, slot: u16) {
        log::warn!(
            "UFS queue pair (tag base {}): giving up the HPB command in slot {slot}",
            self.tag_base
        );
        self.eng.device_may_access = true;
        let _ = self.eng.trackers.retire(slot);
        self.hpb.give_up(slot);
    }

    /// A command needs a host controller reset (policy `Reset`, or an abort
    /// that was refused or not answered). Escalates through
    /// `UfsController::reset_for_timeout`; when that reset fails, ends the
    /// command once as [`IoError::TimedOut`] without its buffer and retires
    /// its slot (see [`UfsQueuePair`]). Returns whether the controller was
    /// reset.
    #[cold]
    fn reset_for_timeout(&mut self, slot: u16, f: &mut dyn FnMut(Completion<B>)) -> bool {
        if self.hpb.is_internal(slot) {
            // Not the application's (the scan excludes them): never a reset
            // or a completion for it.
            self.give_up_internal(slot);
            return false;
        }
        self.eng.timeouts.stats.resets_requested += 1;
        if self.ctrl.reset_for_timeout() {
            // The reset ends every command in flight (the next poll sees it).
            return true;
        }
        // The device may still hold the command: never hand back its
        // buffer, never reuse its slot or command descriptor, and leak the
        // queue's memory at drop.
        self.eng.device_may_access = true;
        self.eng.splits.poison(slot);
        let (tag, buf) = self.eng.trackers.retire(slot);
        self.hpb.write_ended(slot);
        let mut leaked = deliver::leak(buf);
        let routed = self.eng.splits.finish(slot, Err(IoError::TimedOut));
        leaked += self.eng.splits.take_leaked();
        self.ctrl.add_leaked(leaked);
        let (tag, result) = match routed {
            Routed::NotChild => (tag, Err(IoError::TimedOut)),
            Routed::Pending => return false,
            Routed::Done(tag, result, _) => (tag, result),
        };
        self.eng.timeouts.stats.timed_out += 1;
        self.eng.completed += 1;
        f(Completion {
            tag,
            result,
            buf: None,
            dw0: 0,
        });
        false
    }
}

impl<B: IoBuf> UfsQueuePair<B> {
    /// The MCQ cleanup sequence for `slots`: stop the SQ, clean up each
    /// command by its nexus (LUN, task tag) — the controller completes it
    /// with OCS ABORTED, whether still queued or held — and restart the SQ.
    /// Returns how many the controller confirmed (cleanup error code 0), or
    /// `None` if the SQ did not stop within `limit`.
    #[cold]
    fn mcq_cleanup_slots(&mut self, slots: &[u16], limit: std::time::Duration) -> Option<usize> {
        let HwQueue::Mcq(q) = &*self.hwq else {
            return None;
        };
        let regs = self.ctrl.backend().regs();
        let r = q.regs();
        let (rtc, cti, rts) = (r.sqrtc.offset(), r.sqcti.offset(), r.sqrts.offset());
        let wait = |mask: u32, want: u32| {
            let t = Instant::now();
            loop {
                let v = regs.read32(rts);
                if v != u32::MAX && v & mask == want {
                    return Some(v);
                }
                if t.elapsed() > limit {
                    return None;
                }
                std::thread::yield_now();
            }
        };
        regs.write32(rtc, sq_op::RTC_STOP);
        wait(sq_op::RTS_STOPPED, sq_op::RTS_STOPPED)?;
        let mut ok = 0;
        for &slot in slots {
            let lun = self.ucds.command_lun(slot);
            let tag = self.tag_base.wrapping_add(slot as u8);
            regs.write32(cti, sq_op::cleanup_target(lun, tag));
            regs.write32(rtc, sq_op::RTC_STOP | sq_op::RTC_ICU);
            match wait(sq_op::RTS_CLEANUP_DONE, sq_op::RTS_CLEANUP_DONE) {
                Some(v) if sq_op::cleanup_error(v) == 0 => ok += 1,
                v => log::warn!("UFS SQ cleanup of task tag {tag} failed (SQRTS {v:?})"),
            }
        }
        regs.write32(rtc, sq_op::RTC_START);
        if wait(sq_op::RTS_STOPPED, 0).is_none() {
            log::warn!("UFS SQ {} did not restart", q.index());
        }
        Some(ok)
    }

    /// Close's MCQ path: clean up every command in flight, then reap the
    /// ABORTED completions (delivered as [`IoError::Aborted`]). Whatever the
    /// controller does not give back stays outstanding.
    #[cold]
    pub(super) fn mcq_cleanup(
        &mut self,
        limit: std::time::Duration,
        f: &mut dyn FnMut(Completion<B>),
    ) {
        let slots: Vec<u16> = self.eng.trackers.busy().map(|(slot, ..)| slot).collect();
        if self.mcq_cleanup_slots(&slots, limit).is_none() {
            return;
        }
        let start = Instant::now();
        let mut aborted = |mut c: Completion<B>| {
            if c.result == Err(IoError::Ufs(UfsError::Transport(Ocs::ABORTED))) {
                c.result = Err(IoError::Aborted);
            }
            f(c)
        };
        while self.eng.trackers.outstanding() > 0
            && self.eng.stopped.is_none()
            && start.elapsed() < limit
        {
            if matches!(self.poll(usize::MAX, &mut aborted), Ok(0)) {
                std::thread::yield_now();
            }
        }
    }

    /// Report every application command outstanding for longer than
    /// `timeout` (`cid` is its task tag), as
    /// [`QueuePair::check_timeouts`](crate::QueuePair::check_timeouts) does
    /// on NVMe.
    ///
    /// Reporting only, independent of [`UfsQpairOptions::io_timeout`](crate::ufs::UfsQpairOptions::io_timeout)
    /// (which acts by itself inside [`poll`](Self::poll)); pass a reported
    /// `tag` to [`abort`](Self::abort) to withdraw the command. HPB's own
    /// map loads are not listed. Ages use the queue's coarse clock,
    /// refreshed here.
    pub fn check_timeouts(&mut self, timeout: Duration, f: impl FnMut(Outstanding)) -> usize {
        let (hpb, tag_base) = (&self.hpb, self.tag_base);
        self.eng.timeouts.report_overdue(
            &self.eng.trackers,
            timeout,
            |slot| !hpb.is_internal(slot),
            |slot, _| u16::from(tag_base.wrapping_add(slot as u8)),
            f,
        )
    }

    /// Read IS; if the host controller reports a fatal error or is gone,
    /// record that at the controller (a fatal controller is disabled, so no
    /// DMA stays in flight) and return the error. The next
    /// [`poll`](Self::poll) ends the outstanding commands with
    /// [`IoError::ControllerFailed`], as on NVMe
    /// ([`QueuePair::check_health`](crate::QueuePair::check_health)). For an
    /// application that waits without polling; a polling one learns the same
    /// from `poll`. A reset in progress or finished is not a failure.
    pub fn check_health(&mut self) -> Result<()> {
        if let Some(s) = self.eng.stopped {
            return Err(self.stopped_error(s));
        }
        match state::failure(self.ctrl.check_health()) {
            state::OK => Ok(()),
            h => Err(stopped_error(
                Stopped::of(h).unwrap_or(Stopped::Fatal),
                self.queue_id(),
            )),
        }
    }

    /// Abort the command in flight with `tag` (the first, if several share
    /// it). MCQ: SQ stop, cleanup by nexus (a still-queued entry or one the
    /// device holds), SQ restart; legacy: UTRLCLR of its slot. The command
    /// then completes once, through [`poll`](Self::poll), with
    /// `IoError::Ufs(UfsError::Transport(Ocs::ABORTED))` and its buffer —
    /// or normally, if it finished first. Returns `Ok(false)` when no
    /// command with `tag` is in flight or the controller refused the
    /// cleanup; [`Error::Timeout`] when the SQ did not stop.
    pub fn abort(&mut self, tag: u64) -> Result<bool> {
        if let Some(s) = self.eng.stopped {
            return Err(self.stopped_error(s));
        }
        self.hwq.flush();
        let hpb = &self.hpb;
        let Some((slot, ..)) = self
            .eng
            .trackers
            .busy()
            .find(|&(slot, _, t, _)| t == tag && !hpb.is_internal(slot))
        else {
            return Ok(false);
        };
        self.withdraw(slot)
    }

    /// Ask the controller to give up the command in busy `slot` (the
    /// doorbell already rung): MCQ cleanup by nexus, or UTRLCLR. It then
    /// completes through `poll` with OCS ABORTED. `Ok(false)`: refused.
    #[cold]
    fn withdraw(&mut self, slot: u16) -> Result<bool> {
        let limit = self.ctrl.options().init_timeout;
        match &mut *self.hwq {
            HwQueue::Legacy(q) => Ok(q.withdraw(1 << slot)),
            HwQueue::Mcq(_) => match self.mcq_cleanup_slots(&[slot], limit) {
                Some(n) => Ok(n == 1),
                None => Err(Error::Timeout {
                    what: "stop the UFS submission queue (SQRTS.STS)",
                    timeout_ms: limit.as_millis() as u64,
                }),
            },
        }
    }
}

/// UFS's side of the shared timeout scan: log, withdraw the command (MCQ
/// cleanup by nexus, UTRLCLR), escalate to the controller-reset hook.
struct UfsTimeouts<'a, 'f, B: IoBuf> {
    qp: &'a mut UfsQueuePair<B>,
    f: &'a mut (dyn FnMut(Completion<B>) + 'f),
}

impl<B: IoBuf> TimeoutActions for UfsTimeouts<'_, '_, B> {
    type Buf = B;

    fn state(&mut self) -> (&mut Timeouts, &mut Trackers<B>) {
        (&mut self.qp.eng.timeouts, &mut self.qp.eng.trackers)
    }

    fn queue_id(&self) -> u16 {
        self.qp.hw_queue().unwrap_or(0)
    }

    fn abort(&mut self, e: &Expired) -> bool {
        self.qp.withdraw(e.slot).unwrap_or(false)
    }

    fn reset(&mut self, e: &Expired) -> bool {
        self.qp.reset_for_timeout(e.slot, self.f)
    }

    fn stop(&self) -> bool {
        self.qp.eng.stopped.is_some()
    }
}
