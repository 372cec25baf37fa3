//! [`Engine`]: the state every wire's queue pair keeps, and the per-command
//! steps on it (arm, complete, end everything, counters).

use std::time::Duration;

use crate::core::deliver::{self, drain_all, Held};
use crate::core::io::{Completion, DmaBuf, IoBuf, IoError};
use crate::core::split_table::Splits;
use crate::core::state::Stopped;
use crate::core::timeout::{TimeoutPolicy, Timeouts};
use crate::core::tracker::Trackers;

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
    /// System-clock calls of the queue's coarse clock (most readings on
    /// a busy queue take the CPU's counter instead: `core::clock`).
    pub system_clock_reads: u64,
    /// Doorbell register stores (NVMe SQ tail and CQ head, UFS SQTP and
    /// CQHP or UTRLDBR).
    pub doorbell_writes: u64,
    /// Register loads on the I/O path: the health look every
    /// `HEALTH_CHECK_INTERVAL` empty polls (NVMe CSTS, UFS IS), and on UFS
    /// the completion register each busy poll reads (CQTP or UTRLDBR: UFS
    /// completion entries carry no phase bit).
    pub register_reads: u64,
    /// Sleeps on the queue's interrupt (`wait` with
    /// [`WaitPolicy::Interrupt`](crate::WaitPolicy) or `Hybrid`).
    pub interrupt_sleeps: u64,
    /// Of those, the sleeps an interrupt ended (the rest ran out a slice).
    pub interrupt_wakeups: u64,
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
    /// Health looks the poll made (each one register read).
    pub health_checks: u64,
    /// The controller may still access the queue's memory (its rings,
    /// descriptors, in-flight buffers) although the queue gave up on it:
    /// leak it, never free it. Cleared by a new epoch (the controller
    /// dropped the queue).
    pub device_may_access: bool,
    /// A reset removed the queue and it was not re-created (closing).
    pub queue_absent: bool,
    /// How far closing got (see `Lifecycle::shutdown`).
    pub closing: Closing,
    /// Waiting: the policy and the queue's interrupt (read by
    /// `Lifecycle::wait` only; `poll` never touches it).
    pub wait: super::wait::Waiter,
}

/// How far [`Lifecycle::shutdown`](super::Lifecycle::shutdown) (close or drop) got.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Closing {
    /// In use.
    Open,
    /// Closing began: no new internal work (HPB map loads); a panic in the
    /// application's callback leaves this state, and `Drop` resumes.
    Begun,
    /// Every command ended; the wire did its last step.
    Done,
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
            health_checks: 0,
            device_may_access: false,
            queue_absent: false,
            closing: Closing::Open,
            wait: super::wait::Waiter::default(),
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
        // With a split in flight, the cold path ends the command and
        // routes its completion. Decided first: decided after the slot was
        // freed, the buffer taken from it was kept in memory for the cold
        // path's sake on the hot one.
        if self.splits.active() {
            return self.complete_with_splits(slot, dw0, result, internal, f);
        }
        let Some((tag, buf, result)) = self.end_slot(slot, result, internal) else {
            return false;
        };
        // A command of its own built straight into the callback's
        // argument, with the result the caller decided (a constant for a
        // success): no `Option` of a completion in memory, and no merge of
        // two paths' results before the callback.
        self.completed += 1;
        f(Completion {
            tag,
            result,
            buf,
            dw0,
        });
        true
    }

    /// [`complete`](Self::complete)'s first steps: free `slot` (taking
    /// its tag and buffer), decide the result, and let the wire claim a
    /// command of its own (`None`: nothing to deliver).
    #[inline(always)]
    fn end_slot(
        &mut self,
        slot: u16,
        result: impl FnOnce(&mut Timeouts, &Trackers<B>) -> std::result::Result<(), IoError>,
        internal: impl FnOnce(u16, &std::result::Result<(), IoError>) -> bool,
    ) -> Option<(u64, Option<B>, std::result::Result<(), IoError>)> {
        let (tag, buf) = self.trackers.complete(slot);
        let result = result(&mut self.timeouts, &self.trackers);
        (!internal(slot, &result)).then_some((tag, buf, result))
    }

    /// [`complete`](Self::complete) while split transfers are in flight:
    /// the same first steps, then the command's own completion or, after
    /// the last child of a split, its parent's.
    #[cold]
    #[inline(never)]
    fn complete_with_splits<F: FnMut(Completion<B>)>(
        &mut self,
        slot: u16,
        dw0: u32,
        result: impl FnOnce(&mut Timeouts, &Trackers<B>) -> std::result::Result<(), IoError>,
        internal: impl FnOnce(u16, &std::result::Result<(), IoError>) -> bool,
        f: &mut F,
    ) -> bool {
        let Some((tag, buf, result)) = self.end_slot(slot, result, internal) else {
            return false;
        };
        let Some(c) = deliver::route(&mut self.splits, slot, tag, buf, result, dw0) else {
            return false;
        };
        self.completed += 1;
        f(c);
        true
    }

    /// End every command still outstanding with `err` — with its buffer if
    /// `keep_bufs` (the device can no longer access it), else without
    /// (leaked). Children of a split end through their parent. Each
    /// completion is counted (delivered, and by its error in the recovery
    /// counters) before `f` runs: a panicking `f` leaves the rest for a
    /// later call, which counts only those. Returns (completions
    /// delivered, bytes leaked).
    #[cold]
    pub fn end_all(
        &mut self,
        err: IoError,
        keep_bufs: bool,
        f: &mut dyn FnMut(Completion<B>),
    ) -> (usize, u64) {
        let mut leaked = 0u64;
        let completed = &mut self.completed;
        let rstats = &mut self.rstats;
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
                let err = first.unwrap_or(err);
                match err {
                    IoError::AbortedByReset => rstats.aborted_by_reset += 1,
                    IoError::ControllerFailed => rstats.failed_by_controller += 1,
                    _ => {}
                }
                f(Completion {
                    tag,
                    result: Err(err),
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
    /// it; returns the command's CID (one look at the slot for both). The
    /// wire's own commands are armed on the trackers directly.
    #[inline(always)]
    pub fn arm(&mut self, slot: u16, tag: u64, buf: Option<B>) -> u16 {
        self.submitted += 1;
        self.trackers.arm(slot, tag, buf, self.timeouts.now_ms)
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
            system_clock_reads: self.timeouts.clock.system_reads,
            doorbell_writes: 0,
            register_reads: self.health_checks,
            interrupt_sleeps: self.wait.stats.sleeps,
            interrupt_wakeups: self.wait.stats.wakeups,
        }
    }

    /// The application's commands not yet delivered: in flight (less the
    /// wire's own `internal` ones) or ended and held for the next polls.
    #[inline]
    pub fn outstanding(&self, internal: usize) -> usize {
        // `internal <= outstanding` always; saturating all the same.
        self.trackers.outstanding().saturating_sub(internal) + self.held.len()
    }

    /// Reserve a slot for an application command whose checks passed,
    /// reading the clock first if the queue was idle (as
    /// [`stamp_if_idle`](Self::stamp_if_idle) with no commands of the
    /// wire's own): the free list's length against the capacity, one
    /// compare, with the timeout test on the cold path, where a separate
    /// stamp before the checks tested both and counted the outstanding
    /// commands.
    #[inline(always)]
    pub fn reserve(&mut self) -> Option<u16> {
        if self.trackers.is_idle() {
            self.stamp_idle();
        }
        self.trackers.alloc()
    }

    #[cold]
    #[inline(never)]
    fn stamp_idle(&mut self) {
        if self.timeouts.enabled() {
            self.timeouts.tick();
        }
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
