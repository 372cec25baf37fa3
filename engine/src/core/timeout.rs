//! Command timeouts, written once for every wire: the policy, the
//! queue's coarse clock, and the scan that finds expired commands.
//!
//! There is no timer thread. Each queue pair keeps a coarse clock (ms since
//! its creation) that polling refreshes — on every poll that completes
//! something, every `IDLE_CLOCK_INTERVAL` empty polls while commands are
//! outstanding, and when a command arrives on an idle queue — and stamps
//! each command with it when it is armed (`core::tracker`). Once
//! a quarter of the timeout has passed since the last scan, the queue pair
//! runs `scan`: the core walks the busy slots, decides what each expired
//! command needs (`Action`) from the policy and the slot's timeout state,
//! and calls the transport through a small interface (`TimeoutActions`:
//! report, abort, reset) to carry it out — NVMe: an Abort admin command or
//! a controller reset; UFS: MCQ cleanup by nexus or UTRLCLR, or a host
//! controller reset. The transport never calls back into the scan.
//!
//! A command whose completion is already posted (waiting in the CQ for a
//! slow consumer) was answered in time: before the scan the transport
//! marks those slots (`Timeouts::mark_posted`), and they are skipped.

use std::time::Duration;

use super::clock::CoarseClock;

use super::tracker::{tstate, Trackers};

/// Empty polls (with commands outstanding) between reads of the coarse
/// clock, so timeouts are seen on a queue that waits for completions (a
/// non-empty poll always reads it). A power of two.
pub(crate) const IDLE_CLOCK_INTERVAL: u32 = 64;

/// What happens when a command exceeds its timeout.
///
/// A timed-out command's buffer is never handed back while the device may
/// still access it: the command completes only once the device is provably
/// done with it — its own completion arrived (after a successful abort it
/// carries [`crate::IoError::TimedOut`]), or the controller was reset
/// ([`crate::IoError::AbortedByReset`]).
///
/// The same policy serves every wire: NVMe sends an Abort admin
/// command and resets the controller (CC.EN); UFS withdraws the command
/// (MCQ: SQ stop and cleanup by nexus; legacy: UTRLCLR) and escalates to a
/// host controller reset (see [`crate::ufs::UfsQueuePair`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum TimeoutPolicy {
    /// Count and log it ([`crate::QpairStats::timeouts`],
    /// [`crate::ufs::UfsQpairStats::timeouts`]); the command stays
    /// outstanding until the device completes it or the queue is closed or
    /// reset. Use [`crate::QueuePair::check_timeouts`] to list such commands.
    ReportOnly,
    /// Abort it. If the controller gives it up, its completion arrives as
    /// [`crate::IoError::TimedOut`]. If the abort is refused or fails, or
    /// the aborted command still does not complete within another timeout,
    /// reset the controller.
    #[default]
    Abort,
    /// Reset the controller at once.
    Reset,
}

/// What an expired command needs, decided by [`Timeouts::next_expired`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Log it and leave it ([`TimeoutPolicy::ReportOnly`]); then
    /// [`Timeouts::reported`].
    Report,
    /// Ask the device to give it up; then [`Timeouts::abort_sent`].
    Abort,
    /// Reset the controller: the policy says so, an abort was refused, or
    /// an aborted command still did not complete.
    Reset,
}

/// One command the scan found past its time.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Expired {
    pub slot: u16,
    pub cid: u16,
    pub tag: u64,
    pub age_ms: u32,
    pub action: Action,
}

/// Counters of the timeout machinery.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct TimeoutStats {
    /// Commands found past their timeout (once each).
    pub timeouts: u64,
    /// Aborts sent for them.
    pub aborts_sent: u64,
    /// Commands completed as [`crate::IoError::TimedOut`].
    pub timed_out: u64,
    /// Controller resets asked for by the policy.
    pub resets_requested: u64,
}

/// A command still owned by the device, as reported by
/// [`crate::QueuePair::check_timeouts`] and
/// [`crate::ufs::UfsQueuePair::check_timeouts`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Outstanding {
    /// Tag given at submission.
    pub tag: u64,
    /// The command's identifier on the wire: NVMe's command identifier
    /// (for [`crate::QueuePair::abort_command`]); UFS's task tag (what the
    /// device and a cleanup by nexus name it by; to abort it, pass `tag` to
    /// [`crate::ufs::UfsQueuePair::abort`]).
    pub cid: u16,
    /// Age, at the queue's coarse clock (updated once per poll): since
    /// submission, or since the timeout policy last acted on it (Abort sent).
    pub age: Duration,
}

/// A queue pair's timeout state: the policy, the coarse clock, the scan
/// schedule.
#[derive(Debug)]
pub(crate) struct Timeouts {
    pub policy: TimeoutPolicy,
    /// Timeout in ms (0: none).
    timeout_ms: u32,
    scan_interval_ms: u32,
    last_scan_ms: u32,
    /// The coarse clock's last reading (ms since the queue's creation);
    /// commands are stamped with it.
    pub now_ms: u32,
    /// Where readings come from (a CPU counter spares most system-clock
    /// calls on a busy queue: `core::clock`).
    pub clock: CoarseClock,
    pub stats: TimeoutStats,
    /// Scratch bitmap of a scan: slots whose completion is posted but not
    /// yet consumed (one bit per slot).
    posted: Box<[u64]>,
    /// Clock reads so far (tests check where the hot path reads it).
    #[cfg(test)]
    pub ticks: u64,
}

impl Timeouts {
    /// For a queue of `depth` slots.
    pub fn new(timeout: Option<Duration>, policy: TimeoutPolicy, depth: u16) -> Self {
        // Ages are compared with wrapping arithmetic: keep the bound below
        // half the clock's range.
        let timeout_ms =
            timeout.map_or(0, |t| t.as_millis().clamp(1, (u32::MAX / 2) as u128) as u32);
        Timeouts {
            policy,
            timeout_ms,
            scan_interval_ms: (timeout_ms / 4).max(1),
            last_scan_ms: 0,
            now_ms: 0,
            clock: CoarseClock::new(),
            stats: TimeoutStats::default(),
            #[cfg(test)]
            ticks: 0,
            posted: vec![0; usize::from(depth).div_ceil(64)].into_boxed_slice(),
        }
    }

    /// Whether a timeout is set.
    #[inline(always)]
    pub fn enabled(&self) -> bool {
        self.timeout_ms != 0
    }

    /// Read the coarse clock, then report every busy slot of `trackers`
    /// that `mine(slot)` accepts and that is at least `timeout` old, with
    /// its wire identifier `wire_id(slot, cid)`. Reporting only: nothing
    /// changes. Returns how many were reported.
    pub fn report_overdue<B>(
        &mut self,
        trackers: &Trackers<B>,
        timeout: Duration,
        mine: impl Fn(u16) -> bool,
        wire_id: impl Fn(u16, u16) -> u16,
        mut f: impl FnMut(Outstanding),
    ) -> usize {
        self.tick();
        let limit = timeout.as_millis().min(u128::from(u32::MAX)) as u32;
        let mut n = 0;
        for (slot, cid, tag, at) in trackers.busy() {
            let age = self.now_ms.wrapping_sub(at);
            if age >= limit && mine(slot) {
                n += 1;
                f(Outstanding {
                    tag,
                    cid: wire_id(slot, cid),
                    age: Duration::from_millis(u64::from(age)),
                });
            }
        }
        n
    }

    /// Read the coarse clock.
    #[inline]
    pub fn tick(&mut self) {
        self.now_ms = self.clock.now_ms(self.now_ms);
        #[cfg(test)]
        {
            self.ticks += 1;
        }
    }

    /// A command is about to be armed on a queue with `outstanding`
    /// commands: on an idle queue, read the clock so that it (and the rest
    /// of its batch) is stamped with its own submission time — nobody polls
    /// an idle queue, so the last reading may be arbitrarily old. One
    /// compare per command; the clock read only on the idle-to-busy
    /// transition.
    #[inline(always)]
    pub fn stamp_if_idle(&mut self, outstanding: usize) {
        if outstanding == 0 {
            self.tick_cold();
        }
    }

    #[cold]
    #[inline(never)]
    fn tick_cold(&mut self) {
        self.tick();
    }

    /// Whether a scan is due (a timeout is set and a quarter of it passed
    /// since the last scan).
    #[inline(always)]
    pub fn scan_due(&self) -> bool {
        self.timeout_ms != 0 && self.now_ms.wrapping_sub(self.last_scan_ms) >= self.scan_interval_ms
    }

    /// Start a scan: no slot is marked posted yet.
    pub fn begin_scan(&mut self) {
        self.last_scan_ms = self.now_ms;
        self.posted.fill(0);
    }

    /// The completion of the command in `slot` is posted but not consumed:
    /// this scan skips it. Call between [`begin_scan`](Self::begin_scan)
    /// and [`scan`].
    pub fn mark_posted(&mut self, slot: u16) {
        if let Some(w) = self.posted.get_mut(usize::from(slot) / 64) {
            *w |= 1 << (slot % 64);
        }
    }

    /// `slot` holds a command that is not the application's (UFS: an HPB
    /// map load): this scan skips it, as a posted one; the transport times
    /// it out its own way ([`Self::timeout_ms`], [`Self::scan_interval_ms`]).
    /// Call between [`begin_scan`](Self::begin_scan) and [`scan`].
    pub fn exclude(&mut self, slot: u16) {
        self.mark_posted(slot);
    }

    /// The timeout, ms (0: none).
    pub fn timeout_ms(&self) -> u32 {
        self.timeout_ms
    }

    /// The interval between scans, ms.
    pub fn scan_interval_ms(&self) -> u32 {
        self.scan_interval_ms
    }

    fn is_posted(&self, slot: u16) -> bool {
        self.posted
            .get(usize::from(slot) / 64)
            .is_some_and(|w| w & (1 << (slot % 64)) != 0)
    }

    /// The first busy slot at or after `from` that needs an action, skipping
    /// slots marked posted. A command found past its timeout for the first
    /// time is counted.
    pub fn next_expired<B>(&mut self, trackers: &Trackers<B>, from: u16) -> Option<Expired> {
        let limit = self.timeout_ms;
        for slot in from..trackers.slots() as u16 {
            let s = trackers.slot(slot);
            if !s.busy() || self.is_posted(slot) {
                continue;
            }
            let age_ms = self.now_ms.wrapping_sub(s.submitted_ms);
            let action = match s.tstate {
                tstate::NONE if age_ms >= limit => {
                    self.stats.timeouts += 1;
                    match self.policy {
                        TimeoutPolicy::ReportOnly => Action::Report,
                        TimeoutPolicy::Abort => Action::Abort,
                        TimeoutPolicy::Reset => Action::Reset,
                    }
                }
                // Aborted, but its completion did not come either.
                tstate::ABORTING if age_ms >= limit => Action::Reset,
                // Not aborted, and (polls since) it did not complete.
                tstate::ABORT_REFUSED if age_ms >= self.scan_interval_ms => Action::Reset,
                _ => continue,
            };
            return Some(Expired {
                slot,
                cid: s.cid(),
                tag: s.tag,
                age_ms,
                action,
            });
        }
        None
    }

    /// `e` was reported ([`Action::Report`]): leave it alone from now on.
    pub fn reported<B>(&mut self, trackers: &mut Trackers<B>, e: &Expired) {
        let at = trackers.slot(e.slot).submitted_ms;
        trackers.set_tstate(e.slot, tstate::REPORTED, at);
    }

    /// An abort of `e` was sent; `accepted`: the device said it gives the
    /// command up (its completion is due), otherwise the controller is
    /// reset unless it completes soon.
    pub fn abort_sent<B>(&mut self, trackers: &mut Trackers<B>, e: &Expired, accepted: bool) {
        self.stats.aborts_sent += 1;
        let next = if accepted {
            tstate::ABORTING
        } else {
            tstate::ABORT_REFUSED
        };
        trackers.set_tstate(e.slot, next, self.now_ms);
    }

    /// Whether the command just completed in `slot` was aborted by us for a
    /// timeout (its abort status then means [`crate::IoError::TimedOut`]);
    /// counts it if so. Call on the error path only, after `complete` (the
    /// slot keeps its timeout state until it is armed again).
    #[inline]
    pub fn was_aborted<B>(&mut self, trackers: &Trackers<B>, slot: u16) -> bool {
        if trackers.slot(slot).tstate == tstate::ABORTING {
            self.stats.timed_out += 1;
            true
        } else {
            false
        }
    }
}

/// What a transport does for the timeout scan. The core walks the slots
/// and decides ([`scan`]); these carry the decisions out on the wire.
pub(crate) trait TimeoutActions {
    /// The queue's buffers.
    type Buf;
    /// The queue pair's timeout state and trackers.
    fn state(&mut self) -> (&mut Timeouts, &mut Trackers<Self::Buf>);
    /// The queue's name in messages (NVMe: its queue id; UFS: its hardware
    /// queue, or 0 for the legacy list).
    fn queue_id(&self) -> u16;
    /// Log a command found past its timeout under `ReportOnly`.
    fn report(&mut self, e: &Expired) {
        log::warn!(
            "queue {}: command tag {} (slot {}, cid {:#06x}) has no completion after {} ms",
            self.queue_id(),
            e.tag,
            e.slot,
            e.cid,
            e.age_ms
        );
    }
    /// Ask the device to give up `e`'s command; whether it accepted (its
    /// completion is then due, as [`crate::IoError::TimedOut`]).
    fn abort(&mut self, e: &Expired) -> bool;
    /// `e`'s command needs a controller reset. Returns whether the scan
    /// should stop (a reset happened and ends every command).
    fn reset(&mut self, e: &Expired) -> bool;
    /// Whether the scan should stop after an action (the controller was
    /// reset or failed meanwhile).
    fn stop(&self) -> bool;
}

/// One timeout scan (the caller checked [`Timeouts::scan_due`], called
/// [`Timeouts::begin_scan`] and marked posted slots): act on every command
/// past its time, in slot order.
pub(crate) fn scan<Q: TimeoutActions>(q: &mut Q) {
    let mut from = 0;
    loop {
        let (t, trackers) = q.state();
        let Some(e) = t.next_expired(trackers, from) else {
            return;
        };
        from = e.slot + 1;
        match e.action {
            Action::Report => {
                q.report(&e);
                let (t, trackers) = q.state();
                t.reported(trackers, &e);
            }
            Action::Abort => {
                let accepted = q.abort(&e);
                let (t, trackers) = q.state();
                t.abort_sent(trackers, &e, accepted);
            }
            Action::Reset => {
                if q.reset(&e) {
                    return;
                }
            }
        }
        if q.stop() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn armed(depth: u16, n: u16, at: u32) -> Trackers<()> {
        let mut t = Trackers::new(depth);
        for _ in 0..n {
            let s = t.alloc().unwrap();
            t.arm(s, u64::from(s), None, at);
        }
        t
    }

    #[test]
    fn scan_finds_only_expired_unposted_commands_and_counts_each_once() {
        let mut to = Timeouts::new(
            Some(Duration::from_millis(100)),
            TimeoutPolicy::ReportOnly,
            8,
        );
        let mut t = armed(8, 4, 0);
        to.now_ms = 99;
        assert!(to.next_expired(&t, 0).is_none());
        to.now_ms = 100;
        to.begin_scan();
        to.mark_posted(2);
        let mut found = vec![];
        let mut from = 0;
        while let Some(e) = to.next_expired(&t, from) {
            assert_eq!(e.action, Action::Report);
            from = e.slot + 1;
            found.push(e.slot);
            to.reported(&mut t, &e);
        }
        assert_eq!(found, vec![0, 1, 3], "slot 2's completion is posted");
        assert_eq!(to.stats.timeouts, 3);
        assert!(to.next_expired(&t, 0).is_none(), "reported once");
    }

    #[test]
    fn abort_escalates_to_reset() {
        let mut to = Timeouts::new(Some(Duration::from_millis(100)), TimeoutPolicy::Abort, 4);
        let mut t = armed(4, 2, 0);
        to.now_ms = 150;
        let a = to.next_expired(&t, 0).unwrap();
        assert_eq!(a.action, Action::Abort);
        to.abort_sent(&mut t, &a, true);
        let b = to.next_expired(&t, a.slot + 1).unwrap();
        assert_eq!(b.action, Action::Abort);
        to.abort_sent(&mut t, &b, false);
        // Refused: reset after a scan interval; accepted: after a timeout.
        to.now_ms = 150 + 25;
        let e = to.next_expired(&t, 0).unwrap();
        assert_eq!((e.slot, e.action), (b.slot, Action::Reset));
        to.now_ms = 250;
        let e = to.next_expired(&t, 0).unwrap();
        assert_eq!((e.slot, e.action), (a.slot, Action::Reset));
        assert_eq!(to.stats.aborts_sent, 2);
    }

    #[test]
    fn no_timeout_never_scans() {
        let mut to = Timeouts::new(None, TimeoutPolicy::Abort, 4);
        to.now_ms = u32::MAX / 2;
        assert!(!to.scan_due());
    }
}
