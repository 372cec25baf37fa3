//! Receive pacing: which of a queue pair's polls make its `recv`.
//!
//! A PCIe queue sees a completion by reading memory; a socket needs a
//! system call. Receiving on every poll costs one call per few completions
//! (as many as arrived since the last poll), and since a polled application
//! resubmits what completed, one `sendmsg` per as few commands too.
//!
//! [`RecvPacer`] coalesces receives the way a NIC's adaptive interrupt
//! moderation coalesces interrupts, counting polls instead of time (a poll
//! that does not receive costs no system call, and a clock read in a guest
//! without a trusted TSC is one itself):
//!
//! - **Hold after data.** After a receive that brought data, the next
//!   polls of the hold do not receive. The hold is learnt: it grows
//!   by half (plus one) when a receive yielded fewer events (completions
//!   and R2Ts) than it [`wants`] — three quarters of what was in flight
//!   when it was made, at most [`WANT_MAX`] — and shrinks by a quarter when
//!   it yielded as many. At queue depth 1 it wants one event, so every
//!   answer meets it and the hold decays to zero: a lone command is never
//!   held. It never exceeds [`HOLD_MAX`] polls, the bound on the delay it
//!   adds to an answer that has arrived.
//!   A receive that found nothing counts as one that brought no event.
//! - **Back off after nothing, alone.** With one command wanted (one in
//!   flight) a receive that found nothing does not teach the hold;
//!   it skips 1, 2, 4 … [`BACKOFF_MAX`] polls before the next one, and data
//!   ends the backoff — so a lone command's answer is seen within that many
//!   polls of its arrival.
//! - Nothing in flight (and nothing buffered) ends any skip, so the first
//!   poll after an idle spell receives. So does a waiting queue's arm
//!   before it sleeps, and its wake-up (`tcp::ready`): a queue never sleeps
//!   on an answer the pacer held back.
//!
//! `TcpOptions::recv_pacing` off keeps only the backoff (at any depth).
//!
//! The pacer only decides; it reads no clock and makes no call, so its
//! behaviour is a function of the counts it is given (the tests below).

/// The most polls skipped after receives that found nothing (doubling 1,
/// 2, 4, … up to this). A slow target costs about one empty `recv` per
/// this many polls.
pub(crate) const BACKOFF_MAX: u32 = 16;

/// The most polls held after a receive that brought data. On the
/// development host a poll that does not receive takes some tens of
/// nanoseconds in a polled job loop, so this bounds the delay coalescing
/// adds to an arrived answer to well under a millisecond there; the hold
/// only grows that far while the target answers fewer than
/// [`wants`] commands within it, i.e. while its own latency is longer.
pub(crate) const HOLD_MAX: u32 = 8192;

/// The most events one receive is asked to bring.
pub(crate) const WANT_MAX: u32 = 48;

/// Events a receive made with `in_flight` commands outstanding should
/// bring: three quarters of them (at least one, at most [`WANT_MAX`]).
#[inline]
pub(crate) fn wants(in_flight: u32) -> u32 {
    (in_flight - in_flight / 4).clamp(1, WANT_MAX)
}

/// When to receive (see the module docs).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecvPacer {
    /// Polls left before the next receive.
    skip: u32,
    /// The skip the next empty receive sets (doubling).
    backoff: u32,
    /// The learnt hold after a receive that brought data.
    hold: u32,
    /// Hold at all (off: receive on every poll, backing off only after
    /// empty receives at any depth — `TcpOptions::recv_pacing`).
    off: bool,
}

impl RecvPacer {
    /// A pacer that holds (`on`), or only backs off after empty receives.
    pub fn new(on: bool) -> Self {
        RecvPacer {
            off: !on,
            ..RecvPacer::default()
        }
    }

    /// One poll with work outstanding: whether it receives.
    #[inline]
    pub fn due(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            false
        } else {
            true
        }
    }

    /// Nothing is in flight or buffered, or the queue is about to sleep
    /// or just woke: the next poll receives.
    #[inline]
    pub fn idle(&mut self) {
        self.skip = 0;
    }

    /// A receive found nothing, with `in_flight` commands outstanding.
    /// With one command wanted it backs off; with more it is a receive
    /// that brought fewer than it wanted (the hold grows).
    #[inline]
    pub fn empty(&mut self, in_flight: u32) {
        if wants(in_flight) > 1 && !self.off {
            self.got(0, in_flight);
            return;
        }
        self.skip = self.backoff;
        self.backoff = (self.backoff.saturating_mul(2)).clamp(1, BACKOFF_MAX);
    }

    /// A receive brought data; `events` completions and R2Ts came of the
    /// pass, with `in_flight` commands outstanding when it was made.
    #[inline]
    pub fn got(&mut self, events: u32, in_flight: u32) {
        self.backoff = 0;
        if self.off {
            self.skip = 0;
            return;
        }
        if events < wants(in_flight) {
            self.hold = self.hold.saturating_add(self.hold / 2 + 1).min(HOLD_MAX);
        } else {
            self.hold -= self.hold / 4 + u32::from(self.hold > 0 && self.hold < 4);
        }
        self.skip = self.hold;
    }

    /// The learnt hold, in polls.
    #[cfg(test)]
    pub fn hold(&self) -> u32 {
        self.hold
    }

    /// Forget what was learnt (a new connection).
    pub fn reset(&mut self) {
        *self = RecvPacer::new(!self.off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls until the pacer lets one receive.
    fn polls_to_recv(p: &mut RecvPacer) -> u32 {
        let mut n = 1;
        while !p.due() {
            n += 1;
        }
        n
    }

    #[test]
    fn wants_three_quarters_of_what_is_in_flight() {
        assert_eq!(wants(0), 1);
        assert_eq!(wants(1), 1);
        assert_eq!(wants(2), 2);
        assert_eq!(wants(4), 3);
        assert_eq!(wants(32), 24);
        assert_eq!(wants(4096), WANT_MAX);
    }

    /// At depth 1 every answer is all that was wanted: the hold stays
    /// zero, so each poll after an answer receives.
    #[test]
    fn a_lone_command_is_never_held() {
        let mut p = RecvPacer::default();
        for _ in 0..1000 {
            assert!(p.due());
            p.got(1, 1);
            assert_eq!(p.hold(), 0);
        }
    }

    /// A hold learnt at depth 32 decays to zero once the load drops to
    /// depth 1.
    #[test]
    fn a_learnt_hold_decays_when_each_receive_brings_what_it_wants() {
        let mut p = RecvPacer::default();
        for _ in 0..40 {
            p.got(4, 32);
        }
        assert_eq!(p.hold(), HOLD_MAX, "never more than the bound");
        let mut receives = 0;
        while p.hold() > 0 {
            p.got(1, 1);
            receives += 1;
            assert!(receives < 100, "the hold does not decay: {}", p.hold());
        }
        assert!(p.due());
    }

    /// A simulated target that answers one command every `per_answer`
    /// polls, all `depth` in flight, resubmitted as they complete (a
    /// polled job loop). Returns (receives, completions) over `polls`.
    fn closed_loop(depth: u32, per_answer: u32, polls: u32) -> (u32, u32) {
        let mut p = RecvPacer::default();
        let (mut arrived, mut receives, mut done) = (0u32, 0u32, 0u32);
        for t in 1..=polls {
            if t % per_answer == 0 && arrived < depth {
                arrived += 1;
            }
            if !p.due() {
                continue;
            }
            receives += 1;
            let n = arrived.min(depth);
            if n == 0 {
                p.empty(depth);
                continue;
            }
            arrived -= n;
            done += n;
            p.got(n, depth);
        }
        (receives, done)
    }

    /// The mechanism the system-call bar rests on: against a target that
    /// answers steadily (one command per 10 polls), receives settle at 16
    /// or more completions each at depth 32, where receiving on every poll
    /// would take about one each, and nearly all the target's answers are
    /// still taken (the hold costs no throughput while the queue is full).
    #[test]
    fn a_steady_target_at_depth_32_is_received_in_batches() {
        let (receives, done) = closed_loop(32, 10, 200_000);
        assert!(done > 19_000, "completions {done}");
        assert!(
            receives * 16 <= done,
            "{receives} receives for {done} completions"
        );
    }

    /// Against a target slower than the bound, the hold stops at
    /// `HOLD_MAX` and answers still come in, a batch per hold.
    #[test]
    fn a_target_slower_than_the_bound_is_still_received() {
        let (receives, done) = closed_loop(32, 2 * HOLD_MAX, 40 * HOLD_MAX);
        assert!(done >= 19, "completions {done}");
        assert!(receives > 0);
    }

    #[test]
    fn empty_receives_back_off_doubling_to_the_bound() {
        let mut p = RecvPacer::default();
        let mut gaps = Vec::new();
        for _ in 0..8 {
            p.empty(1);
            gaps.push(polls_to_recv(&mut p));
        }
        assert_eq!(gaps, [1, 2, 3, 5, 9, 17, 17, 17]);
        assert_eq!(p.hold(), 0, "a lone command's empty receives teach nothing");
        p.got(1, 1);
        p.empty(1);
        assert_eq!(polls_to_recv(&mut p), 1, "data ends the backoff");
    }

    /// With many in flight, a receive that found nothing grows the hold
    /// like one that found too little, so waiting on a busy target costs
    /// fewer and fewer empty receives (not one per 17 polls).
    #[test]
    fn empty_receives_with_many_in_flight_grow_the_hold() {
        let mut p = RecvPacer::default();
        let mut gaps = Vec::new();
        for _ in 0..12 {
            p.empty(32);
            gaps.push(polls_to_recv(&mut p));
        }
        assert_eq!(gaps, [2, 3, 5, 8, 12, 18, 27, 41, 62, 93, 140, 210]);
        for _ in 0..40 {
            p.empty(32);
        }
        assert_eq!(p.hold(), HOLD_MAX);
    }

    /// Switched off, the pacer never holds: at depth 32 against the same
    /// steady target it receives on nearly every poll that has an answer,
    /// and only backs off after empty receives.
    #[test]
    fn switched_off_it_only_backs_off() {
        let mut p = RecvPacer::new(false);
        for _ in 0..10 {
            p.got(1, 32);
            assert!(p.due());
        }
        p.empty(32);
        assert!(p.due(), "the first empty receive skips nothing");
        p.empty(32);
        assert!(!p.due());
        assert!(p.due());
        p.reset();
        p.got(1, 32);
        assert!(p.due(), "still off after a reset");
    }

    #[test]
    fn idle_ends_a_skip() {
        let mut p = RecvPacer::default();
        for _ in 0..20 {
            p.got(1, 32);
        }
        assert!(!p.due());
        p.idle();
        assert!(p.due());
    }
}
