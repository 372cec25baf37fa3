//! The queue pair's lifecycle, written once: [`Engine`] holds what every
//! wire's queue pair keeps, [`Wire`] the hooks each wire implements, and
//! [`Lifecycle`] (implemented for every `Wire` by a blanket impl, so no
//! wire can override it) what every wire's queue pair does on them.
//!
//! A wire (NVMe over PCIe, NVMe over TCP, UFS MCQ or legacy) implements
//! the small required part of [`Wire`] — ring the doorbell, reap completion entries
//! and prove each one belongs to the command in its slot, look at the
//! controller's health, act on a timeout, hand over what the controller
//! posted before it stopped, forget its rings, re-create its queue — and
//! gets from the core:
//!
//! - the **submit gate** ([`Lifecycle::gate`]): one relaxed load of the
//!   controller's state word per batch; no doorbell once a reset began or
//!   the queue stopped;
//! - the **poll skeleton** ([`Lifecycle::poll`]): gate → ring → reap at most
//!   `max` (each completion counted before the callback runs) → idle ticks
//!   of the coarse clock → a health look every
//!   [`Wire::HEALTH_CHECK_INTERVAL`] empty polls → the timeout scan when due
//!   → the wire's after-poll work;
//! - **recovery** ([`Lifecycle::recover`]): the one state machine after the state
//!   word changed (see [`super::state`]): deliver what was posted, end the
//!   rest once ([`Engine::end_all`]) with or without buffers by the
//!   fail → disable → leak rule, re-create the queue after a reset;
//! - **one budget mechanism**: whatever recovery or a timeout ends beyond
//!   the poll's `max` waits in the engine's held completions, preallocated
//!   to the queue depth at creation, and the next polls hand them out
//!   first. `poll` never delivers more than `max`;
//! - **close and drop** ([`Lifecycle::shutdown`]): held completions first, a
//!   reset caught up with, the queue taken off the device
//!   ([`Wire::withdraw_all`]), the rest ended once with or without buffers;
//!   resumable after a panic in the callback;
//! - the split planner ([`Engine::plan_split`]), and [`Addressed`]: one
//!   `BlockQueue` and blocking-helper implementation for every wire.
//!
//! # A fourth wire, a new frontend
//!
//! A new wire (NVMe over RDMA, say) is a folder beside `nvme/pcie/` and
//! `nvme/tcp/`, reusing `nvme/{spec, ctrl, admin}`; its queue pair is a
//! `qpair/` folder with the same files for the same roles as the other
//! three (`mod`, `create`, `submit`, `reap`, `wire`, `timeouts`,
//! `teardown`, `wait`, `blocking`): it embeds an [`Engine`] and
//! implements [`Wire`] in `qpair/wire.rs` — `ring` (post the queued
//! commands), `reap` (prove each completion by its CID, end it through
//! [`Engine::complete`]), `check_controller`, `scan_timeouts` (Abort on
//! the admin queue), `deliver_posted` and `forget` (what a dropped
//! connection leaves), `recreate` (reconnect the queue), `withdraw_all` —
//! and [`Addressed`] (its addresses and block commands); its controller
//! implements [`super::state::Controlled`]. A frontend (a ublk server)
//! uses only the public API — [`super::block::BlockQueue`],
//! [`super::per_core`], the device opener in `examples/open` — beside the
//! fio engine in `examples/`. Neither changes anything in `core/`.
//!
//! Everything is static dispatch: a wire's queue pair embeds an
//! [`Engine`] and implements [`Wire`]; its public `poll` and `submit` are
//! [`Lifecycle`]'s, monomorphised and inlined for that wire. Nothing
//! here allocates after creation, and nothing names a wire.

use super::error::{Error, Result};
use super::io::{Completion, IoBuf, IoError};
use super::state::{self, Change, Controlled, Stopped};
use super::timeout::IDLE_CLOCK_INTERVAL;

mod addressed;
mod engine;
mod split_plan;
#[cfg(test)]
mod tests;
pub(crate) mod wait;

pub(crate) use self::addressed::Addressed;
pub use self::engine::QueueCounters;
pub(crate) use self::engine::{Closing, Engine};
pub(crate) use self::split_plan::{Child, SplitRequest};
pub use self::wait::{Interrupt, SleepOn, WaitPolicy};

/// What one reaping pass found.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct Reaped {
    /// Completion entries consumed (stale ones included).
    pub seen: usize,
    /// Completions delivered to the callback.
    pub delivered: usize,
    /// The completion register read a value no healthy controller gives
    /// (all ones, a tail outside the ring): look at the controller's
    /// health now.
    pub suspect: bool,
}

/// Re-creating the queue after a reset.
pub(crate) enum Recreated {
    /// Done; the controller's state word it was done in.
    Yes(u64),
    /// The state word moved on meanwhile (another reset): look again.
    Moved,
    /// Failed with this error; `left`: the controller may have the queue
    /// (partly) on our rings.
    Failed { error: String, left: bool },
}

/// The three accessors every [`Wire`] impl writes the same way, for a
/// queue pair that keeps its [`Engine`] in field `$eng` and its
/// controller (an `Arc`) in field `$ctrl`: `wire_parts!(eng, ctrl);`
/// inside the impl.
macro_rules! wire_parts {
    ($eng:ident, $ctrl:ident) => {
        #[inline(always)]
        fn eng(&mut self) -> &mut $crate::core::qpair::Engine<Self::Buf, Self::Child> {
            &mut self.$eng
        }

        #[inline(always)]
        fn eng_ref(&self) -> &$crate::core::qpair::Engine<Self::Buf, Self::Child> {
            &self.$eng
        }

        #[inline(always)]
        fn ctrl(&self) -> &Self::Ctrl {
            &self.$ctrl
        }
    };
}
pub(crate) use wire_parts;

/// A wire's queue pair: the hooks it implements, and the lifecycle the
/// core provides on them (see the module docs).
pub(crate) trait Wire: Sized {
    /// The buffers moved through the queue.
    type Buf: IoBuf;
    /// What the wire keeps per child while building a split transfer.
    type Child;
    /// Empty polls (with commands outstanding) between health looks.
    const HEALTH_CHECK_INTERVAL: u32;

    /// The engine state.
    fn eng(&mut self) -> &mut Engine<Self::Buf, Self::Child>;
    /// The engine state, shared.
    fn eng_ref(&self) -> &Engine<Self::Buf, Self::Child>;

    /// The controller the queue belongs to.
    type Ctrl: Controlled;
    /// The controller.
    fn ctrl(&self) -> &Self::Ctrl;
    /// Ring the doorbell for what was queued since the last ring; whether
    /// a doorbell was written. Only called with the gate open.
    fn ring(&mut self) -> bool;
    /// Consume up to `max` completion entries: prove each one, then end
    /// its command through [`Engine::complete`]; write the completion
    /// queue's head.
    fn reap<F: FnMut(Completion<Self::Buf>)>(&mut self, max: usize, f: &mut F) -> Reaped;
    /// Look at the controller's health; a failure is recorded at the
    /// controller (which changes the state word) for every queue pair.
    fn check_controller(&mut self);
    /// Act on the commands past their timeout (the scan is due). `drained`:
    /// the poll consumed everything the controller had posted. Completions
    /// go to `f` (the engine holds what exceeds the poll's budget).
    fn scan_timeouts(&mut self, drained: bool, f: &mut dyn FnMut(Completion<Self::Buf>));
    /// The wire's work after a poll (UFS: the HPB pass).
    #[inline(always)]
    fn after_poll(&mut self) {}
    /// The wire's own register accesses so far: (doorbell stores, register
    /// loads besides the health looks the core counts).
    fn accesses(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Recovery step 1: deliver what the controller completed before it
    /// stopped (it can post no more), each entry proven as `reap` proves
    /// it. No doorbell. Returns the completions delivered. Also called by
    /// closing when the withdrawal failed or was not confirmed: then the
    /// controller may post more later, and only what it posted so far is
    /// looked at.
    fn deliver_posted(&mut self, f: &mut dyn FnMut(Completion<Self::Buf>)) -> usize;
    /// Before the core ends every command: end the wire's own commands
    /// (no application completion), with or without their buffers. Returns
    /// the bytes leaked.
    fn end_internal(&mut self, _keep_bufs: bool) -> u64 {
        0
    }
    /// The controller dropped the queue (or gave up on it): the wire's own
    /// record of what is in flight, and its ring positions, are void.
    fn forget(&mut self);
    /// Re-create the queue on the controller in state `settled`.
    fn recreate(&mut self, settled: u64) -> Recreated;
    /// Count `bytes` as leaked at the controller.
    fn note_leak(&self, bytes: u64);
    /// The queue's id for messages.
    fn queue_id(&self) -> u16;
    /// The error a stopped queue reports, in the wire's words.
    fn stopped_error(&self, s: Stopped) -> Error;
    /// Closing: take the queue off the device, delivering what it still
    /// completes through `f`. `Ok(true)`: the device holds none of the
    /// queue's commands any more; `Ok(false)`: it may still (a withdrawal
    /// it did not confirm); `Err`: the queue could not be taken off and
    /// stays on the device. Called again after a panic in `f`, it carries
    /// on from its last finished step.
    fn withdraw_all(&mut self, f: &mut dyn FnMut(Completion<Self::Buf>)) -> Result<bool>;
    /// Closing finished; `gone`: a reset or failure had already removed
    /// the queue (nothing was withdrawn).
    fn closed(&mut self, gone: bool);

    /// Arm the queue's interrupt before the last poll of a sleeping wait
    /// (see [`wait`]): clear what its notifier counted. A wire with a
    /// level-triggered line also acknowledges its interrupt status and
    /// unmasks the line here; a wire whose interrupt is a readiness makes
    /// sure its next poll looks at everything the readiness covers.
    #[cold]
    fn arm_interrupt(&mut self) {
        if let Some(i) = &self.eng_ref().wait.irq {
            i.clear();
        }
    }

    /// After a sleep, before the poll that follows it (see [`wait`]): the
    /// wire makes that poll look everywhere the interrupt could have come
    /// from (NVMe/TCP: receive, whatever its pacing held).
    #[cold]
    fn after_sleep(&mut self) {}
}

/// The lifecycle the core provides on a [`Wire`]'s hooks (see the module
/// docs): implemented for every wire by the blanket impl below and by no
/// wire itself, so a wire cannot override `poll`, `recover`, `shutdown`
/// or the rest by accident (a second impl would conflict). Static
/// dispatch as before: each method is monomorphised and inlined for the
/// wire that calls it.
pub(crate) trait Lifecycle: Wire {
    /// The shared counters, with the wire's register accesses.
    fn all_counters(&self) -> QueueCounters {
        let mut c = self.eng_ref().counters();
        let (writes, reads) = self.accesses();
        c.doorbell_writes += writes;
        c.register_reads += reads;
        c
    }

    /// Poll until something completes, or `timeout` passes (`None`: no
    /// limit), spinning or sleeping on the queue's interrupt as its
    /// [`WaitPolicy`] says (see [`wait`] for the order that loses no
    /// wake-up). Completions reach `f` through `poll` only; returns how
    /// many (0: the timeout passed, or nothing is outstanding). A failed
    /// or reset controller ends the wait as `poll` reports it. `max` = 0
    /// is refused ([`Error::InvalidOption`]): such a wait could deliver
    /// nothing, so nothing but its limit could end it (`poll(0)` rings
    /// without waiting).
    #[cold]
    #[inline(never)]
    fn wait<F: FnMut(Completion<Self::Buf>)>(
        &mut self,
        max: usize,
        timeout: Option<std::time::Duration>,
        f: &mut F,
    ) -> Result<usize> {
        use std::time::Instant;
        if max == 0 {
            return Err(wait::no_completion_asked());
        }
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        // Completions the application's own polls delivered since the
        // last wait count for the hybrid spin, as of now (at most the
        // length of one empty poll late, when the caller polls and waits
        // in turn).
        let e = self.eng();
        if e.completed != e.wait.seen_completed {
            e.wait.seen_completed = e.completed;
            e.wait.last_completion = Some(start);
        }
        // Arm after every empty poll, not after a batch of them: policy
        // `Interrupt`, or a hybrid spin window already over (a zero spin,
        // no completion yet) — and, below, once the policy said sleep.
        // Spun a batch first, a window over at the start ran 31 polls
        // long, and a completion within them was taken without a sleep.
        let mut at_once = e.wait.should_sleep(start);
        let mut spins = 0u32;
        loop {
            let n = self.poll(max, f)?;
            if n > 0 {
                let e = self.eng();
                e.wait.last_completion = Some(Instant::now());
                e.wait.seen_completed = e.completed;
                return Ok(n);
            }
            let e = self.eng_ref();
            if e.trackers.outstanding() == 0 && e.held.is_empty() {
                return Ok(0);
            }
            spins += 1;
            // Spinning looks at the clock (deadline, hybrid window) every
            // few polls.
            if spins % wait::SPIN_BATCH != 0 && !at_once {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if wait::past(deadline, now) {
                return Ok(0);
            }
            // Arm (when the policy says sleep now), then poll again, then
            // block (see the `wait` module).
            let Some(sleep) = self.arm_sleep() else {
                continue;
            };
            // The window is over for the rest of this wait: a completion
            // ends it.
            at_once = true;
            let n = self.poll(max, f)?;
            if n > 0 {
                let e = self.eng();
                e.wait.last_completion = Some(Instant::now());
                e.wait.seen_completed = e.completed;
                return Ok(n);
            }
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(sleep.slice),
                None => sleep.slice,
            };
            let woken = sleep.interrupt.wait(Some(slice)).unwrap_or(false);
            self.slept(woken);
        }
    }

    /// Steps 2 and 3 of a sleeping wait, for [`wait`](Self::wait) and for a
    /// driver that sleeps elsewhere ([`BlockQueue::arm_sleep`](crate::core::block::BlockQueue::arm_sleep)):
    /// if the policy says sleep now, arm the interrupt and fence, and say
    /// what to sleep on; the caller polls once more before it sleeps.
    #[cold]
    fn arm_sleep(&mut self) -> Option<wait::SleepOn> {
        let now = std::time::Instant::now();
        let e = self.eng();
        // Completions delivered by polls since the last look count for the
        // hybrid spin.
        if e.completed != e.wait.seen_completed {
            e.wait.seen_completed = e.completed;
            e.wait.last_completion = Some(now);
        }
        if !e.wait.should_sleep(now) {
            return None;
        }
        let interrupt = e.wait.irq.clone()?;
        let slice = e.wait.slice;
        self.arm_interrupt();
        // Orders the clear of the notifier (and the wire's acknowledgement)
        // before the loads of the poll that follows (see the `wait` module).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Some(wait::SleepOn { interrupt, slice })
    }

    /// After a sleep [`arm_sleep`](Self::arm_sleep) prepared; `woken`:
    /// the interrupt ended it. One that ran out its slice keeps timeouts
    /// due and looks at the controller's health (nobody polled meanwhile).
    #[cold]
    fn slept(&mut self, woken: bool) {
        self.after_sleep();
        let e = self.eng();
        e.wait.stats.sleeps += 1;
        if woken {
            e.wait.stats.wakeups += 1;
        } else {
            if e.timeouts.enabled() {
                e.timeouts.tick();
            }
            e.health_checks += 1;
            self.check_controller();
        }
    }

    /// The controller's state word: one relaxed load.
    #[inline(always)]
    fn state(&self) -> u64 {
        self.ctrl().state_word().load()
    }

    /// The controller's state word once no reset is running.
    fn settled_state(&self) -> u64 {
        self.ctrl().settled_state()
    }

    /// The submit gate: the controller is in the state this queue's rings
    /// belong to, and the queue did not stop.
    #[inline(always)]
    fn gate(&self) -> bool {
        let e = self.eng_ref();
        e.stopped.is_none() && self.state() == e.seen_state
    }

    /// Ring the doorbell once for everything queued since the last ring.
    /// Returns whether a doorbell was written: `false` when there was
    /// nothing to ring, when the queue stopped, and when the controller
    /// was reset or failed since this queue last looked (the next poll
    /// ends what was queued and re-creates the queue).
    #[inline]
    fn submit(&mut self) -> bool {
        self.gate() && self.ring()
    }

    /// The poll skeleton (see the module docs).
    #[inline]
    fn poll<F: FnMut(Completion<Self::Buf>)>(&mut self, max: usize, f: &mut F) -> Result<usize> {
        let e = self.eng_ref();
        let max = max.min(e.max_per_poll);
        if e.stopped.is_some() || !e.held.is_empty() || self.state() != e.seen_state {
            return self.poll_cold(max, f);
        }
        self.ring();
        let r = self.reap(max, f);
        let mut n = r.delivered;
        let e = self.eng();
        if r.seen == 0 && e.trackers.outstanding() > 0 {
            e.idle_polls = e.idle_polls.wrapping_add(1);
            if e.idle_polls % IDLE_CLOCK_INTERVAL == 0 && e.timeouts.enabled() {
                e.timeouts.tick();
            }
            if r.suspect || e.idle_polls % Self::HEALTH_CHECK_INTERVAL == 0 {
                e.health_checks += 1;
                self.check_controller();
                if self.state() != self.eng_ref().seen_state {
                    return Ok(n + self.poll_cold(max - n, f)?);
                }
            }
        } else {
            e.idle_polls = 0;
            if r.seen != 0 && e.timeouts.enabled() {
                e.timeouts.tick();
            }
        }
        if self.eng_ref().timeouts.scan_due() && !r.suspect {
            let drained = r.seen < max;
            n += self.budgeted(max - n, f, |q, g| q.scan_timeouts(drained, g));
            if self.state() != self.eng_ref().seen_state {
                return Ok(n + self.poll_cold(max - n, f)?);
            }
        }
        self.after_poll();
        Ok(n)
    }

    /// Run `end`, which ends any number of commands through the callback
    /// it gets, so that at most `budget` reach `f` and the rest are held.
    #[cold]
    fn budgeted<F: FnMut(Completion<Self::Buf>)>(
        &mut self,
        budget: usize,
        f: &mut F,
        end: impl FnOnce(&mut Self, &mut dyn FnMut(Completion<Self::Buf>)),
    ) -> usize {
        // Taken while `end` runs: `f` is only called before anything new
        // is held (the budget comes first), and older held ones are not
        // passed to `f` here, so a panicking `f` loses none.
        let mut held = std::mem::take(&mut self.eng().held);
        let ((), k) = held.budgeted(budget, f, |g| end(self, g));
        self.eng().held = held;
        k
    }

    /// `poll` when completions are held, or the state word changed, or the
    /// queue stopped: hand out held completions, then ring (the gate open)
    /// or recover, at most `max` in all (the rest are held).
    #[cold]
    #[inline(never)]
    fn poll_cold<F: FnMut(Completion<Self::Buf>)>(
        &mut self,
        max: usize,
        f: &mut F,
    ) -> Result<usize> {
        let mut n = self.eng().held.deliver(max, f);
        let e = self.eng_ref();
        if e.stopped.is_none() && self.state() == e.seen_state {
            // The gate is open: what was queued goes out, as every poll
            // rings (`poll(0)` too).
            self.ring();
            return Ok(n);
        }
        let mut r = Ok(0);
        n += self.budgeted(max - n, f, |q, g| r = q.recover(true, g));
        r.map(|_| n)
    }

    /// Close (or drop): every command still in flight ends exactly once
    /// through `f` — what the device completed (before, or while the queue
    /// is taken off it, even when that fails) as the device said, the rest
    /// as [`IoError::Aborted`], with their
    /// buffers only if the device can no longer touch them (otherwise they
    /// are leaked, with the queue's memory). After a reset or failure the
    /// commands end as `poll` would end them, and a stopped queue reports
    /// its error once every command was delivered. A panic in `f` skips
    /// none of this: `Drop` calls this again and it carries on.
    #[cold]
    fn shutdown(&mut self, f: &mut dyn FnMut(Completion<Self::Buf>)) -> Result<()> {
        if self.eng_ref().closing == Closing::Done {
            return Ok(());
        }
        self.eng().closing = Closing::Begun;
        self.eng().held.deliver(usize::MAX, &mut |c| f(c));
        let mut r = Ok(false);
        if self.state() == self.eng_ref().seen_state && self.eng_ref().stopped.is_none() {
            r = self.withdraw_all(f);
        }
        // A reset or failure (before, or while withdrawing): the queue is
        // gone from the device; end the rest as poll would.
        if self.state() != self.eng_ref().seen_state {
            let _ = self.recover(false, f);
        }
        let e = self.eng_ref();
        if e.stopped.is_some() || e.queue_absent {
            let stopped = e.stopped;
            self.eng().closing = Closing::Done;
            self.closed(true);
            return match stopped {
                Some(s) => Err(self.stopped_error(s)),
                None => Ok(()),
            };
        }
        let safe = matches!(r, Ok(true));
        if !safe {
            // The queue may still be on the device, but what it posted is
            // its answer: delivered as it said (with its buffer), not
            // ended as aborted.
            self.deliver_posted(f);
        }
        let left = self.eng_ref().trackers.outstanding();
        if !safe && left > 0 {
            log::error!(
                "queue {}: the device may still hold {left} commands; they end without their buffers, which are leaked with the queue's memory",
                self.queue_id()
            );
        }
        // The wire's own commands end inside it, the application's once each.
        let mut leaked = self.end_internal(safe);
        leaked += self.eng().end_all(IoError::Aborted, safe, f).1;
        if !safe {
            self.eng().device_may_access = true;
        }
        self.note_leak(leaked);
        self.eng().closing = Closing::Done;
        self.closed(false);
        r.map(|_| ())
    }

    /// Recovery after the controller's state word changed (see
    /// [`super::state`]): every command ends exactly once, through `f`.
    /// With `recreate` false (closing) the queue is not re-created after a
    /// reset; [`Engine::queue_absent`] says so. Returns the completions
    /// delivered, or the stopped queue's error.
    #[cold]
    #[inline(never)]
    fn recover(
        &mut self,
        recreate: bool,
        f: &mut dyn FnMut(Completion<Self::Buf>),
    ) -> Result<usize> {
        let mut n = 0;
        loop {
            if self.state() == self.eng_ref().seen_state {
                return match self.eng_ref().stopped {
                    Some(s) => Err(self.stopped_error(s)),
                    None => Ok(n),
                };
            }
            // Waits for a reset in progress to finish.
            let settled = self.settled_state();
            let failed = state::failure(settled) != state::OK;
            match state::change(self.eng_ref().seen_state, settled) {
                Change::Same => continue,
                Change::Undisabled => {
                    // Failed without being disabled: the controller may
                    // still access the rings, descriptors and buffers.
                    self.eng().device_may_access = true;
                    n += self.deliver_posted(f);
                    let mut leaked = self.end_internal(false);
                    let ended = self.eng_ref().trackers.outstanding();
                    if ended > 0 {
                        log::error!(
                            "queue {}: the controller could not be disabled; {ended} commands end without their buffers",
                            self.queue_id()
                        );
                    }
                    let (k, l) = self.eng().end_all(IoError::ControllerFailed, false, f);
                    n += k;
                    leaked += l;
                    self.note_leak(leaked);
                    self.forget();
                    let e = self.eng();
                    e.stopped = Some(Stopped::of(settled).unwrap_or(Stopped::Fatal));
                    e.seen_state = settled;
                }
                Change::NewEpoch { .. } => {
                    // Disabled (or gone) since: the controller dropped the
                    // queue and accesses none of its memory.
                    n += self.deliver_posted(f);
                    let leaked = self.end_internal(true);
                    self.note_leak(leaked);
                    let (err, e) = if failed {
                        (IoError::ControllerFailed, self.eng())
                    } else {
                        (IoError::AbortedByReset, self.eng())
                    };
                    let (k, _) = e.end_all(err, true, f);
                    n += k;
                    e.device_may_access = false;
                    e.seen_state = settled;
                    self.forget();
                    if failed {
                        self.eng().stopped = Stopped::of(settled);
                        continue;
                    }
                    if !recreate {
                        self.eng().queue_absent = true;
                        return Ok(n);
                    }
                    match self.recreate(settled) {
                        Recreated::Yes(s) => {
                            let e = self.eng();
                            // The controller dropped every command: slots
                            // retired by a failed timeout action serve again.
                            e.trackers.unretire_all();
                            e.seen_state = s;
                            e.stopped = None;
                            e.idle_polls = 0;
                            e.rstats.recoveries += 1;
                        }
                        Recreated::Moved => continue,
                        Recreated::Failed { error, left } => {
                            if self.state() != settled {
                                continue; // reset again meanwhile: retry
                            }
                            let qid = self.queue_id();
                            log::error!(
                                "queue {qid}: re-creating the queue after a reset failed: {error}"
                            );
                            let e = self.eng();
                            e.device_may_access |= left;
                            e.stopped = Some(Stopped::Lost);
                            return Err(Error::QueueLost { qid });
                        }
                    }
                }
            }
        }
    }
}

impl<W: Wire> Lifecycle for W {}
