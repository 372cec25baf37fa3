//! The H2CData a queue pair owes for R2Ts: a FIFO of R2Ts, each answered
//! in order, PDU by PDU, as the send queue has room.
//!
//! An R2T may ask for any part of a command's transfer (Linux's nvmet-tcp
//! asks for all of it at once; at MAXH2CDATA 4096 a 4 MiB write is 1024
//! H2CData PDUs), and a target may have R2Ts outstanding for every command
//! in flight, MAXR2T + 1 each. The send queue's header arena is sized for
//! a batch of submissions, not for the largest R2T a target may send; so
//! an R2T is never answered all at once but queued here, and its H2CData
//! PDUs go to the send queue as it has room, oldest R2T first, each R2T's
//! PDUs in offset order. The space is fixed: a command has at most
//! MAXR2T + 1 R2Ts here (more is the target's violation), so the FIFO is
//! sized once, by slots × (MAXR2T + 1), and never grows on the I/O path.
//!
//! An entry stays until its data has all been *sent* (handed to the
//! socket), not just queued: that is when the target may count the R2T
//! done and send the next one, so it is what a command's count of
//! outstanding R2Ts and its completion check (no completion before its
//! data left) are measured against. Entries wholly queued form a prefix of
//! the FIFO whose end positions in the send stream grow along it, so
//! [`R2tQueue::retire`] pops from the front only.

use std::collections::VecDeque;

/// One R2T whose data has not all been sent.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Owed {
    /// The command's tracker slot.
    pub slot: u16,
    /// Its CID (slot and generation): an entry whose command ended is
    /// recognised by it and dropped, never answered.
    pub cid: u16,
    /// The R2T's transfer tag.
    pub ttag: u16,
    /// The next offset to queue.
    pub at: u32,
    /// The offset after the R2T's last byte.
    pub end: u32,
    /// The send stream position after its last byte, once all queued.
    pub done_at: u64,
}

/// The FIFO (see the module docs).
#[derive(Debug)]
pub(super) struct R2tQueue {
    q: VecDeque<Owed>,
    /// Entries before this index are wholly queued.
    queued: usize,
}

impl R2tQueue {
    /// Room for `n` R2Ts, allocated now.
    pub fn with_capacity(n: usize) -> Self {
        R2tQueue {
            q: VecDeque::with_capacity(n),
            queued: 0,
        }
    }

    /// Nothing is owed.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Some R2T's data is not all queued yet.
    #[inline(always)]
    pub fn has_unqueued(&self) -> bool {
        self.queued < self.q.len()
    }

    /// A new R2T (`at < end`), answered after every R2T before it.
    pub fn push(&mut self, o: Owed) {
        debug_assert!(o.at < o.end);
        self.q.push_back(o);
    }

    /// The oldest R2T whose data is not all queued.
    #[inline]
    pub fn next_to_queue(&self) -> Option<Owed> {
        self.q.get(self.queued).copied()
    }

    /// [`R2tQueue::next_to_queue`]'s R2T has queued up to `at`; once that
    /// is its end, it is wholly queued, its last byte at `done_at`.
    #[inline]
    pub fn queued_to(&mut self, at: u32, done_at: u64) {
        let Some(o) = self.q.get_mut(self.queued) else {
            return;
        };
        o.at = at;
        if at == o.end {
            o.done_at = done_at;
            self.queued += 1;
        }
    }

    /// Drop [`R2tQueue::next_to_queue`]'s R2T unanswered (its command
    /// ended).
    #[cold]
    pub fn drop_next(&mut self) -> Option<Owed> {
        self.q.remove(self.queued)
    }

    /// Pop the R2Ts whose data has all been sent (`sent`: the send
    /// stream position handed to the socket), oldest first, each to
    /// `each`.
    #[inline]
    pub fn retire(&mut self, sent: u64, mut each: impl FnMut(&Owed)) {
        while self.queued > 0 {
            let Some(o) = self.q.front() else { break };
            if o.done_at > sent {
                break;
            }
            each(o);
            self.q.pop_front();
            self.queued -= 1;
        }
    }

    /// Forget everything (the connection ended: nothing is sent again).
    pub fn clear(&mut self) {
        self.q.clear();
        self.queued = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owed(slot: u16, at: u32, end: u32) -> Owed {
        Owed {
            slot,
            cid: slot,
            ttag: slot,
            at,
            end,
            done_at: 0,
        }
    }

    /// Answered in order, piece by piece; retired only once sent, from
    /// the front; an entry of an ended command dropped unanswered.
    #[test]
    fn r2ts_are_answered_in_order_and_retired_once_sent() {
        let mut r = R2tQueue::with_capacity(4);
        assert!(r.is_empty() && !r.has_unqueued());
        r.push(owed(1, 0, 8192));
        r.push(owed(2, 0, 4096));
        r.push(owed(3, 0, 4096));
        assert_eq!(r.next_to_queue().unwrap().slot, 1);
        r.queued_to(4096, 0);
        assert_eq!(r.next_to_queue().unwrap().at, 4096, "half queued");
        r.queued_to(8192, 100);
        assert_eq!(r.next_to_queue().unwrap().slot, 2);
        r.queued_to(4096, 200);
        let mut seen = Vec::new();
        r.retire(99, |o| seen.push(o.slot));
        assert!(seen.is_empty(), "not sent yet");
        r.retire(150, |o| seen.push(o.slot));
        assert_eq!(seen, [1]);
        // Slot 3's command ended: dropped, never queued.
        assert_eq!(r.drop_next().unwrap().slot, 3);
        assert!(!r.has_unqueued());
        r.retire(u64::MAX, |o| seen.push(o.slot));
        assert_eq!(seen, [1, 2]);
        assert!(r.is_empty());
        assert!(r.q.capacity() >= 4);
    }
}
