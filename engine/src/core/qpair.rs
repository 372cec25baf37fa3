//! The queue pair's lifecycle, written once: [`Engine`] holds what every
//! wire's queue pair keeps, and [`Wire`]'s provided methods carry what
//! every wire's queue pair does.
//!
//! A wire (NVMe over PCIe, UFS MCQ or legacy) implements the small
//! required part of [`Wire`] — ring the doorbell, reap completion entries
//! and prove each one belongs to the command in its slot, look at the
//! controller's health, act on a timeout, hand over what the controller
//! posted before it stopped, forget its rings, re-create its queue — and
//! gets from the core:
//!
//! - the **submit gate** ([`Wire::gate`]): one relaxed load of the
//!   controller's state word per batch; no doorbell once a reset began or
//!   the queue stopped;
//! - the **poll skeleton** ([`Wire::poll`]): gate → ring → reap at most
//!   `max` (each completion counted before the callback runs) → idle ticks
//!   of the coarse clock → a health look every
//!   [`Wire::HEALTH_CHECK_INTERVAL`] empty polls → the timeout scan when due
//!   → the wire's after-poll work;
//! - **recovery** ([`Wire::recover`]): the one state machine after the state
//!   word changed (see [`super::state`]): deliver what was posted, end the
//!   rest once ([`Engine::end_all`]) with or without buffers by the
//!   fail → disable → leak rule, re-create the queue after a reset;
//! - **one budget mechanism**: whatever recovery or a timeout ends beyond
//!   the poll's `max` waits in the engine's held completions, preallocated
//!   to the queue depth at creation, and the next polls hand them out
//!   first. `poll` never delivers more than `max`.
//!
//! # A third wire, a new frontend
//!
//! A new wire (NVMe over TCP, say) is a folder beside `nvme/pcie/`
//! (`nvme/tcp/`), reusing `nvme/{spec, ctrl, admin}`: its queue pair embeds
//! an [`Engine`] and implements [`Wire`] — `ring` (send the queued capsules),
//! `reap` (parse received PDUs, prove each by its CID, end it through
//! [`Engine::complete`]), `check_controller` (the connection's health),
//! `scan_timeouts` (Abort on the admin queue), `deliver_posted` and `forget`
//! (what a dropped connection leaves), `recreate` (reconnect the queue), and
//! its controller implements [`super::state::Controlled`]. A frontend (a
//! ublk server) uses only the public API — [`super::block::BlockQueue`],
//! [`super::per_core`], the device opener in `examples/open` — beside the
//! fio engine in `examples/`. Neither changes anything in `core/`.
//!
//! Everything is static dispatch: a wire's queue pair embeds an
//! [`Engine`] and implements [`Wire`]; its public `poll` and `submit` are
//! the provided methods, monomorphised and inlined for that wire. Nothing
//! here allocates after creation, and nothing names a wire.

use std::sync::Arc;
use std::time::Duration;

use mcqio_vfio::DmaSpace;

use super::block::{BlockQueue, Blocking};
use super::deliver::{self, drain_all, Held};
use super::error::{Error, Result};
use super::io::{Completion, DmaBuf, IoBuf, IoError, SubmitError, SubmitErrorKind};
use super::split::Splits;
use super::state::{self, Change, Controlled, Stopped};
use super::timeout::{TimeoutPolicy, Timeouts, IDLE_CLOCK_INTERVAL};
use super::tracker::Trackers;

/// The counters every wire's queue pair keeps, in one type: what
/// `QueuePair::counters` (NVMe) and `UfsQueuePair::counters` return, so a
/// tool reads one set of names on any wire. Each wire's `stats()` adds its
/// own (doorbells, register reads).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Commands accepted (each child of a split transfer counts; HPB's own
    /// commands do not).
    pub submitted: u64,
    /// Completions delivered (a split transfer delivers one).
    pub completed: u64,
    /// Completion entries that proved no command in flight (stale,
    /// duplicate, corrupt): counted and dropped, never delivered.
    pub stale_completions: u64,
    /// Commands found past their timeout.
    pub timeouts: u64,
    /// Aborts (NVMe Abort, UFS cleanup or UTRLCLR) sent for them.
    pub aborts_sent: u64,
    /// Commands completed as [`IoError::TimedOut`].
    pub timed_out: u64,
    /// Controller resets the timeout policy asked for.
    pub resets_requested: u64,
    /// Commands completed with [`IoError::AbortedByReset`].
    pub aborted_by_reset: u64,
    /// Commands completed with [`IoError::ControllerFailed`].
    pub failed_by_controller: u64,
    /// Controller resets the queue pair recovered from.
    pub recoveries: u64,
}

/// Counters of the cold recovery paths, the same on every wire.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecoveryStats {
    /// Commands ended with [`IoError::AbortedByReset`].
    pub aborted_by_reset: u64,
    /// Commands ended with [`IoError::ControllerFailed`].
    pub failed_by_controller: u64,
    /// Controller resets the queue recovered from (its queue re-created).
    pub recoveries: u64,
}

/// The state every wire's queue pair keeps (see the module docs). `S` is
/// what the wire keeps per child while it builds a split transfer.
pub(crate) struct Engine<B: IoBuf, S> {
    /// Command slots with generations, tags, buffers and ages.
    pub trackers: Trackers<B>,
    /// Transfers split into child commands.
    pub splits: Splits<B, S>,
    /// Timeout policy, coarse clock and scan schedule.
    pub timeouts: Timeouts,
    /// Completions ended beyond a poll's `max`.
    pub held: Held<B>,
    /// The controller state word this queue's rings belong to.
    pub seen_state: u64,
    /// Why the queue stopped accepting commands.
    pub stopped: Option<Stopped>,
    /// Commands accepted (each child of a split counts).
    pub submitted: u64,
    /// Completions delivered.
    pub completed: u64,
    /// Consecutive polls that found nothing with commands outstanding.
    pub idle_polls: u32,
    /// Most completions one poll delivers.
    pub max_per_poll: usize,
    /// Largest transfer per command, in bytes.
    pub max_xfer: u64,
    /// How long blocking helpers wait.
    pub blocking_timeout: Duration,
    /// The blocking helpers' bounce buffer.
    pub bounce: Option<DmaBuf>,
    /// Cold-path counters.
    pub rstats: RecoveryStats,
    /// The controller may still access the queue's memory (its rings,
    /// descriptors, in-flight buffers) although the queue gave up on it:
    /// leak it, never free it. Cleared by a new epoch (the controller
    /// dropped the queue).
    pub device_may_access: bool,
    /// A reset removed the queue and it was not re-created (closing).
    pub queue_absent: bool,
}

impl<B: IoBuf, S> Engine<B, S> {
    /// An engine for a queue of `depth` commands on a controller in state
    /// `seen_state`.
    pub fn new(
        depth: u16,
        max_per_poll: usize,
        max_xfer: u64,
        io_timeout: Option<Duration>,
        policy: TimeoutPolicy,
        blocking_timeout: Duration,
        seen_state: u64,
    ) -> Self {
        Engine {
            trackers: Trackers::new(depth),
            splits: Splits::new(depth),
            timeouts: Timeouts::new(io_timeout, policy, depth),
            held: Held::with_capacity(usize::from(depth)),
            seen_state,
            stopped: Stopped::of(seen_state),
            submitted: 0,
            completed: 0,
            idle_polls: 0,
            max_per_poll: match max_per_poll {
                0 => usize::from(depth),
                n => n,
            },
            max_xfer,
            blocking_timeout,
            bounce: None,
            rstats: RecoveryStats::default(),
            device_may_access: false,
            queue_absent: false,
        }
    }

    /// The command in `slot` (proven by the wire to be the one its
    /// completion entry is for) finished: free its slot, decide its
    /// `result` (given the timeout state, which the slot keeps until it is
    /// armed again), then deliver its completion — or its parent's, after
    /// the last child of a split — counted before `f` runs (it may panic).
    /// `internal` sees the freed slot first and returns true for a command
    /// that is the wire's own (no application completion). Returns whether
    /// `f` was called.
    #[inline(always)]
    pub fn complete<F: FnMut(Completion<B>)>(
        &mut self,
        slot: u16,
        dw0: u32,
        result: impl FnOnce(&mut Timeouts, &Trackers<B>) -> std::result::Result<(), IoError>,
        internal: impl FnOnce(u16, &std::result::Result<(), IoError>) -> bool,
        f: &mut F,
    ) -> bool {
        // Right after the wire's lookup of `slot`: one bounds check.
        let (tag, buf) = self.trackers.complete(slot);
        let result = result(&mut self.timeouts, &self.trackers);
        if internal(slot, &result) {
            return false;
        }
        match deliver::route(&mut self.splits, slot, tag, buf, result, dw0) {
            Some(c) => {
                self.completed += 1;
                f(c);
                true
            }
            None => false,
        }
    }

    /// End every command still outstanding with `err` — with its buffer if
    /// `keep_bufs` (the device can no longer access it), else without
    /// (leaked). Children of a split end through their parent. Returns
    /// (completions delivered, bytes leaked).
    #[cold]
    pub fn end_all(
        &mut self,
        err: IoError,
        keep_bufs: bool,
        f: &mut dyn FnMut(Completion<B>),
    ) -> (usize, u64) {
        let mut leaked = 0u64;
        let completed = &mut self.completed;
        let n = drain_all(
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
        (n, leaked + self.splits.take_leaked())
    }

    /// Commands that may be outstanding at once.
    #[inline]
    pub fn depth(&self) -> usize {
        self.trackers.depth()
    }

    /// The application's command in reserved `slot` was posted: arm its
    /// tracker (tag, buffer, submission time on the coarse clock) and count
    /// it. The wire's own commands are armed on the trackers directly.
    #[inline(always)]
    pub fn arm(&mut self, slot: u16, tag: u64, buf: Option<B>) {
        self.trackers.arm(slot, tag, buf, self.timeouts.now_ms);
        self.submitted += 1;
    }

    /// The shared counters.
    pub fn counters(&self) -> QueueCounters {
        let t = &self.timeouts.stats;
        QueueCounters {
            submitted: self.submitted,
            completed: self.completed,
            stale_completions: self.trackers.stale,
            timeouts: t.timeouts,
            aborts_sent: t.aborts_sent,
            timed_out: t.timed_out,
            resets_requested: t.resets_requested,
            aborted_by_reset: self.rstats.aborted_by_reset,
            failed_by_controller: self.rstats.failed_by_controller,
            recoveries: self.rstats.recoveries,
        }
    }

    /// The application's commands not yet delivered: in flight (less the
    /// wire's own `internal` ones) or ended and held for the next polls.
    #[inline]
    pub fn outstanding(&self, internal: usize) -> usize {
        // `internal <= outstanding` always; saturating all the same.
        self.trackers.outstanding().saturating_sub(internal) + self.held.len()
    }

    /// Read the clock if the queue is idle for the application
    /// (`Timeouts::stamp_if_idle`); `internal` of the outstanding commands
    /// are the wire's own.
    #[inline(always)]
    pub fn stamp_if_idle(&mut self, internal: usize) {
        if self.timeouts.enabled() {
            // `internal <= outstanding` always; a wrap would only skip a
            // clock read.
            self.timeouts
                .stamp_if_idle(self.trackers.outstanding().wrapping_sub(internal));
        }
    }
}

/// One child of a split transfer, as the core planned it.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Child {
    /// Its tracker slot (reserved).
    pub slot: u16,
    /// Its first block.
    pub lba: u64,
    /// Its blocks.
    pub blocks: u32,
    /// Its byte range in the parent's buffer.
    pub offset: u64,
    /// Its bytes.
    pub bytes: u64,
}

/// A read or write above the per-command limit (see `super::split`).
#[derive(Copy, Clone, Debug)]
pub(crate) struct SplitRequest {
    /// First block of the whole transfer.
    pub lba: u64,
    /// Its blocks.
    pub blocks: u32,
    /// log2 of the block size.
    pub shift: u32,
    /// The most blocks one child may carry (0: one block is already above
    /// the per-command limit).
    pub per_child: u64,
    /// The caller's tag.
    pub tag: u64,
}

impl<B: IoBuf, S> Engine<B, S> {
    /// Plan a split transfer and reserve it, all or nothing: the checks
    /// (no more children than the depth, a buffer large enough, a free slot
    /// for every child), then for each child a slot and the wire's
    /// descriptors (`build`, given the child and the buffer; its `Err`
    /// refuses the whole transfer), then the parent. Nothing reaches the
    /// device here. On success the children are in the returned list
    /// (pass it back to [`Engine::armed_split`] once the wire posted them)
    /// with the parent's index; on refusal every slot is free again and the
    /// buffer comes back.
    #[cold]
    #[allow(clippy::type_complexity)]
    pub fn plan_split(
        &mut self,
        r: SplitRequest,
        buf: B,
        mut build: impl FnMut(&Child, &B) -> std::result::Result<S, SubmitErrorKind>,
    ) -> std::result::Result<(u16, Vec<(Child, S)>), SubmitError<B>> {
        let bytes = u64::from(r.blocks) << r.shift;
        let depth = self.trackers.depth() as u64;
        let children = match r.per_child {
            // A single block is larger than one command may carry.
            0 => u64::MAX,
            n => u64::from(r.blocks).div_ceil(n),
        };
        let refuse = |kind, buf| Err(SubmitError { kind, buf });
        if children > depth {
            // A block above the per-command limit reports that limit, not 0.
            let max = match r.per_child {
                0 => self.max_xfer,
                n => (n << r.shift).saturating_mul(depth),
            };
            return refuse(SubmitErrorKind::TransferTooLarge { bytes, max }, buf);
        }
        let available = buf.total_len() as u64;
        if available < bytes {
            return refuse(
                SubmitErrorKind::BufferTooSmall {
                    needed: bytes,
                    available,
                },
                buf,
            );
        }
        if self.trackers.depth() - self.trackers.outstanding() < children as usize {
            return refuse(SubmitErrorKind::QueueFull, buf);
        }
        let mut scratch = std::mem::take(&mut self.splits.scratch);
        scratch.clear();
        let mut failed = None;
        for i in 0..children {
            let Some(slot) = self.trackers.alloc() else {
                failed = Some(SubmitErrorKind::QueueFull);
                break;
            };
            let first = i * r.per_child;
            let blocks = r.per_child.min(u64::from(r.blocks) - first) as u32;
            let c = Child {
                slot,
                lba: r.lba + first,
                blocks,
                offset: first << r.shift,
                bytes: u64::from(blocks) << r.shift,
            };
            match build(&c, &buf) {
                Ok(w) => scratch.push((c, w)),
                Err(kind) => {
                    self.trackers.unreserve(slot);
                    failed = Some(kind);
                    break;
                }
            }
        }
        let parent = match failed {
            Some(kind) => Err((kind, buf)),
            // Not expected (a parent is free whenever slots are): refuse
            // rather than lose track.
            None => self
                .splits
                .start(r.tag, buf, children as u32)
                .map_err(|buf| (SubmitErrorKind::QueueFull, buf)),
        };
        match parent {
            Ok(p) => Ok((p, scratch)),
            Err((kind, buf)) => {
                for (c, _) in scratch.iter().rev() {
                    self.trackers.unreserve(c.slot);
                }
                self.splits.scratch = scratch;
                refuse(kind, buf)
            }
        }
    }

    /// The child in `slot` of parent `p` was posted: arm it under the
    /// caller's `tag`.
    #[inline]
    pub fn arm_child(&mut self, slot: u16, p: u16, tag: u64) {
        self.splits.link(slot, p);
        self.arm(slot, tag, None);
    }

    /// Every child of a planned split was posted and armed: keep the list's
    /// allocation for the next split.
    #[inline]
    pub fn armed_split(&mut self, scratch: Vec<(Child, S)>) {
        self.splits.scratch = scratch;
    }
}

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
    /// Recovery step 1: deliver what the controller completed before it
    /// stopped (it can post no more), each entry proven as `reap` proves
    /// it. No doorbell. Returns the completions delivered.
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
    /// queue stopped: hand out held completions, then recover, at most
    /// `max` in all (the rest are held).
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
            return Ok(n);
        }
        let mut r = Ok(0);
        n += self.budgeted(max - n, f, |q, g| r = q.recover(true, g));
        r.map(|_| n)
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
                    let e = self.eng();
                    let (k, l) = e.end_all(IoError::ControllerFailed, false, f);
                    e.rstats.failed_by_controller += k as u64;
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
                    if failed {
                        e.rstats.failed_by_controller += k as u64;
                    } else {
                        e.rstats.aborted_by_reset += k as u64;
                    }
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

/// What a wire's queue pair adds to the lifecycle to be a [`BlockQueue`]
/// (and to run the blocking helpers): its address type and its block
/// commands. The `BlockQueue` and blocking implementations below are
/// written once, for every such wire.
pub(crate) trait Addressed: Wire {
    /// An NVMe namespace id, a UFS LUN.
    type Addr: Copy + Into<u32>;
    /// Queue a read (`read`) or a write of `blocks` blocks at `lba` of `at`.
    fn read_write(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: Self::Buf,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<Self::Buf>>;
    /// Queue a cache flush of `at`.
    fn flush_at(&mut self, at: Self::Addr, tag: u64) -> std::result::Result<(), SubmitError<()>>;
    /// Queue the deallocation of `blocks` blocks at `lba` of `at`.
    fn deallocate_at(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>>;
    /// log2 of the block size of `at`.
    fn shift_of(&self, at: Self::Addr) -> Option<u32>;
    /// The refusal for an address that names nothing, in the wire's words.
    fn unknown_at(at: Self::Addr) -> SubmitErrorKind {
        SubmitErrorKind::UnknownNamespace { nsid: at.into() }
    }
    /// Commands in flight that are the wire's own (not the application's).
    #[inline(always)]
    fn internal(&self) -> usize {
        0
    }
    /// Where the blocking helpers' bounce buffer is allocated.
    fn dma_space(&self) -> &Arc<DmaSpace>;
    /// Most bytes one command may move with blocks of `1 << shift` bytes.
    fn limit_for(&self, shift: u32) -> u64 {
        let _ = shift;
        self.eng_ref().max_xfer
    }
    /// Finish the queue pair: every command ends once through `f`.
    fn finish<F: FnMut(Completion<Self::Buf>)>(self, f: F) -> Result<()>;
}

// Spelled with `A` and `B` bound by the projections so that the public
// trait's associated types name no crate-private trait.
impl<Q, A, B> BlockQueue for Q
where
    Q: Addressed<Addr = A> + Wire<Buf = B>,
    A: Copy + Into<u32>,
    B: IoBuf,
{
    type Addr = A;
    type Buf = B;

    #[inline]
    fn read(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: Self::Buf,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<Self::Buf>> {
        self.read_write(at, lba, blocks, buf, tag, true)
    }

    #[inline]
    fn write(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: Self::Buf,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<Self::Buf>> {
        self.read_write(at, lba, blocks, buf, tag, false)
    }

    fn flush(&mut self, at: Self::Addr, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        self.flush_at(at, tag)
    }

    fn deallocate(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        self.deallocate_at(at, lba, blocks, tag)
    }

    #[inline]
    fn submit(&mut self) -> bool {
        Wire::submit(self)
    }

    #[inline]
    fn poll<F: FnMut(Completion<Self::Buf>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        Wire::poll(self, max, &mut f)
    }

    #[inline]
    fn depth(&self) -> usize {
        self.eng_ref().depth()
    }

    #[inline]
    fn outstanding(&self) -> usize {
        self.eng_ref().outstanding(self.internal())
    }

    #[inline]
    fn is_full(&self) -> bool {
        self.eng_ref().trackers.is_full()
    }

    fn max_transfer(&self) -> u64 {
        self.eng_ref().max_xfer
    }

    fn block_shift(&self, at: Self::Addr) -> Option<u32> {
        self.shift_of(at)
    }

    fn unknown(at: Self::Addr) -> SubmitErrorKind {
        Q::unknown_at(at)
    }

    fn close<F: FnMut(Completion<Self::Buf>)>(self, f: F) -> Result<()> {
        self.finish(f)
    }
}

impl<Q: Addressed> Blocking for Q {
    fn bounce(&mut self) -> &mut Option<DmaBuf> {
        &mut self.eng().bounce
    }

    fn space(&self) -> &Arc<DmaSpace> {
        self.dma_space()
    }

    fn blocking_timeout(&self) -> Duration {
        self.eng_ref().blocking_timeout
    }

    fn command_limit(&self, shift: u32) -> u64 {
        self.limit_for(shift)
    }

    /// Blocking calls first catch up with a reset or failure (nothing is
    /// outstanding, so nothing is lost) so they never submit into a queue
    /// the controller already dropped.
    fn blocking_sync(&mut self) -> Result<()> {
        if self.state() != self.eng_ref().seen_state {
            self.recover(true, &mut drop)?;
        }
        match self.eng_ref().stopped {
            Some(s) => Err(self.stopped_error(s)),
            None => Ok(()),
        }
    }
}
