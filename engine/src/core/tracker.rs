//! Per-slot command state and command identifiers.
//!
//! Each queue pre-allocates one [`Slot`] per possible outstanding command.
//! A command's CID is `slot | generation << slot_bits`: the low bits find the
//! slot without a search, the generation changes every time the slot is
//! reused. A CQE whose CID does not match a busy slot's current CID (a
//! duplicate, a late completion of an earlier command in that slot, or a
//! corrupted CID) is counted as stale and never delivered.
//!
//! With depth `d`, `slot_bits = ceil(log2 d)` and the remaining `16 -
//! slot_bits` bits are generation (at least 4 for the maximum depth of
//! 4096), so a stale CQE is caught unless its slot has been reused exactly
//! a multiple of `2^gen_bits` times since — vanishingly unlikely for
//! duplicates, which arrive right after the original.

/// One command's bookkeeping. Kept small: the hot path touches one slot.
pub(crate) struct Slot<B> {
    pub tag: u64,
    pub buf: Option<B>,
    /// The CID a completion must carry to end this slot's command: the
    /// command's CID while it is in flight; when the slot is not busy, the
    /// next command's CID with [`NOT_BUSY`] set, which no 16-bit CID
    /// equals. So a completion is matched with one compare of busy and
    /// CID together.
    expect: u32,
    /// Coarse submit time (queue clock, ms) for timeout scans; once a
    /// timeout was acted on, the time of that action.
    pub submitted_ms: u32,
    /// Timeout handling state ([`tstate`]).
    pub tstate: u8,
    /// Out of service ([`Trackers::retire`]) until [`Trackers::unretire_all`].
    /// Kept apart from "not busy and not free", which is also what a slot
    /// reserved by `alloc` and not yet armed looks like.
    retired: bool,
}

/// Timeout handling states of a slot.
pub(crate) mod tstate {
    /// Not timed out.
    pub const NONE: u8 = 0;
    /// Timed out under `ReportOnly`: reported, left alone.
    pub const REPORTED: u8 = 1;
    /// The controller accepted an Abort for it; its completion is due.
    pub const ABORTING: u8 = 2;
    /// The Abort was refused or failed: reset unless it completes soon.
    pub const ABORT_REFUSED: u8 = 3;
}

/// Reserved CID: the Error Information log uses FFFFh for "no command".
const CID_RESERVED: u16 = 0xFFFF;

/// Set in [`Slot::expect`] while the slot has no command in flight.
const NOT_BUSY: u32 = 1 << 16;

/// The generation after `next` (a free slot's `expect` naming the reserved
/// CID): the slot bits are unchanged because `step` is a multiple of
/// 2^slot_bits. Rare (once per 2^gen_bits uses of the last slot), so a
/// call, not a conditional move on every completion.
#[cold]
#[inline(never)]
fn skip_reserved(next: u32, step: u16) -> u32 {
    NOT_BUSY | u32::from((next as u16).wrapping_add(step))
}

impl<B> Slot<B> {
    /// CID of the command in flight (or of the next one, when free).
    #[inline(always)]
    pub fn cid(&self) -> u16 {
        self.expect as u16
    }

    /// Whether a command is in flight in this slot.
    #[inline(always)]
    pub fn busy(&self) -> bool {
        self.expect & NOT_BUSY == 0
    }
}

/// The free slots, a stack as deep as the queue: a push never allocates
/// (as `Vec::push` might, which made the completion path keep its values
/// on the stack across the call), and a push past the depth — a slot
/// freed twice — panics instead of growing.
struct FreeList {
    ids: Box<[u16]>,
    len: usize,
}

impl FreeList {
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    fn pop(&mut self) -> Option<u16> {
        let n = self.len.checked_sub(1)?;
        self.len = n;
        // SAFETY: `n < len <= ids.len()`: `len` starts at `ids.len()`, and
        // only `push` raises it, through a checked index (a push past the
        // end panics before `len` moves). The compare against the slice's
        // length that `get` made was one more than the hot path needs.
        Some(unsafe { *self.ids.get_unchecked(n) })
    }

    #[inline(always)]
    fn push(&mut self, slot: u16) {
        self.ids[self.len] = slot;
        self.len += 1;
    }
}

pub(crate) struct Trackers<B> {
    /// `slot_mask + 1` slots: `depth` in service, the rest (up to the next
    /// power of two) never handed out and never busy, so any CID's slot
    /// bits index a slot without a bounds check.
    slots: Box<[Slot<B>]>,
    /// The queue's depth: slots `0..built_depth` are handed out (less
    /// retired ones, see `capacity`).
    built_depth: usize,
    free: FreeList,
    /// Slots in service: all of them, less the retired ones.
    capacity: usize,
    /// `1 << slot_bits`: what a slot's CID advances by per use, kept
    /// rather than shifted out of `slot_bits` at every completion.
    gen_step: u16,
    slot_mask: u16,
    /// Stale or duplicate CQEs seen.
    pub stale: u64,
}

impl<B> Trackers<B> {
    /// `depth` slots (1..=4096).
    pub fn new(depth: u16) -> Self {
        assert!((1..=4096).contains(&depth));
        let slot_bits = (u16::BITS - (depth - 1).leading_zeros()).max(1);
        let slot_mask = ((1u32 << slot_bits) - 1) as u16;
        let slots = (0..=slot_mask)
            .map(|i| Slot {
                tag: 0,
                buf: None,
                expect: NOT_BUSY | u32::from(i),
                submitted_ms: 0,
                tstate: tstate::NONE,
                retired: false,
            })
            .collect();
        // Pop order: slot 0 first.
        let free = FreeList {
            ids: (0..depth).rev().collect(),
            len: usize::from(depth),
        };
        Trackers {
            capacity: usize::from(depth),
            built_depth: usize::from(depth),
            slots,
            free,
            gen_step: 1 << slot_bits,
            slot_mask,
            stale: 0,
        }
    }

    /// Slots in service (the queue's depth, less retired slots).
    #[inline]
    pub fn depth(&self) -> usize {
        self.capacity
    }

    /// Slots that can hold a command, `0..depth`, for scans over every
    /// slot and for per-slot state kept beside the tracker (retired ones
    /// are never busy). The padding past the depth is the tracker's own.
    #[inline]
    pub fn slots(&self) -> usize {
        self.built_depth
    }

    /// The slot `slot`'s low bits name: every index up to `slot_mask` is
    /// in `slots`, so the masked index needs no bounds check. `slot` comes
    /// from `alloc`, `lookup` or a scan, so the mask changes nothing.
    #[inline(always)]
    fn at(&mut self, slot: u16) -> &mut Slot<B> {
        debug_assert!(usize::from(slot) < self.slots.len());
        let i = usize::from(slot & self.slot_mask);
        // SAFETY: `slots.len() == slot_mask + 1` (built so in `new`, never
        // resized), so `i <= slot_mask` is in bounds.
        unsafe { self.slots.get_unchecked_mut(i) }
    }

    #[inline]
    pub fn outstanding(&self) -> usize {
        self.capacity - self.free.len()
    }

    /// No command in flight (nor reserved).
    #[inline(always)]
    pub fn is_idle(&self) -> bool {
        self.free.len() == self.capacity
    }

    #[inline]
    pub fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// Reserve a free slot; its CID is `slot(s).cid`.
    #[inline]
    pub fn alloc(&mut self) -> Option<u16> {
        self.free.pop()
    }

    /// Return a slot reserved by `alloc` but never armed (submission failed).
    #[inline]
    pub fn unreserve(&mut self, slot: u16) {
        self.free.push(slot);
    }

    #[inline]
    pub fn slot(&self, slot: u16) -> &Slot<B> {
        &self.slots[slot as usize]
    }

    /// Mark `slot` in flight; returns its CID.
    #[inline]
    pub fn arm(&mut self, slot: u16, tag: u64, buf: Option<B>, now_ms: u32) -> u16 {
        let s = self.at(slot);
        s.tag = tag;
        s.buf = buf;
        let cid = s.cid();
        s.expect = u32::from(cid);
        s.submitted_ms = now_ms;
        s.tstate = tstate::NONE;
        cid
    }

    /// Record a timeout action on busy `slot` at `now_ms`.
    pub fn set_tstate(&mut self, slot: u16, state: u8, now_ms: u32) {
        let s = self.at(slot);
        s.tstate = state;
        s.submitted_ms = now_ms;
    }

    /// The slot a CID refers to, if it is in flight with exactly that CID.
    #[inline]
    pub fn lookup(&self, cid: u16) -> Option<u16> {
        let slot = cid & self.slot_mask;
        // SAFETY: `slots.len() == slot_mask + 1` (see `at`).
        let s = unsafe { self.slots.get_unchecked(usize::from(slot)) };
        // Busy and this CID in one compare (`Slot::expect`).
        (s.expect == u32::from(cid)).then_some(slot)
    }

    /// Finish the command in `slot` (from `lookup`): free it, advance its
    /// generation, and hand back tag and buffer.
    #[inline]
    pub fn complete(&mut self, slot: u16) -> (u64, Option<B>) {
        let step = self.gen_step;
        let s = self.at(slot);
        debug_assert!(s.busy());
        // Busy, `expect` is the CID (below 2^16) and `step` at most 2^15,
        // so the sum is below 2^17: or-ing in NOT_BUSY (bit 16) leaves the
        // next CID, the sum's low 16 bits, with NOT_BUSY set, whether or
        // not the add carried into bit 16.
        let mut next = (s.expect + u32::from(step)) | NOT_BUSY;
        if next as u16 == CID_RESERVED {
            next = skip_reserved(next, step);
        }
        s.expect = next;
        let out = (s.tag, s.buf.take());
        self.free.push(slot);
        out
    }

    /// End the command in busy `slot` without returning the slot to
    /// service: the device may still hold the command (and write what the
    /// slot indexes, such as a command descriptor), so the slot is never
    /// reused. Its generation advances, so a late completion is stale.
    /// Hands back tag and buffer (the caller must not give the buffer back
    /// to the application).
    pub fn retire(&mut self, slot: u16) -> (u64, Option<B>) {
        let out = self.complete(slot);
        // `complete` pushed it last onto the free list.
        let popped = self.free.pop();
        debug_assert_eq!(popped, Some(slot));
        self.slots[slot as usize].retired = true;
        self.capacity -= 1;
        out
    }

    /// Return every retired slot to service (the device dropped every
    /// command: controller reset). For the UFS host-controller reset path
    /// that the timeout hook escalates to (`UfsController::reset_for_timeout`).
    ///
    /// Only slots marked by [`retire`](Self::retire) go back on the free
    /// list. A slot reserved by [`alloc`](Self::alloc) and not yet armed is
    /// also neither busy nor free, but its owner still holds it and will
    /// arm or unreserve it: were it freed here too, it would sit on the
    /// free list twice after that and two commands would share it. (No
    /// caller resets between reserve and arm today — every wire
    /// reserve and arm within one `&mut` submission — but the tracker does
    /// not rely on it.)
    pub fn unretire_all(&mut self) {
        if self.capacity == self.built_depth {
            return;
        }
        for (i, s) in self.slots.iter_mut().enumerate() {
            if std::mem::take(&mut s.retired) {
                debug_assert!(!s.busy());
                self.free.push(i as u16);
            }
        }
        self.capacity = self.built_depth;
    }

    /// Iterate over busy slots: (slot, cid, tag, submitted_ms).
    pub fn busy(&self) -> impl Iterator<Item = (u16, u16, u64, u32)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.busy())
            .map(|(i, s)| (i as u16, s.cid(), s.tag, s.submitted_ms))
    }

    /// Complete every busy slot (the device no longer owns them: queue
    /// deleted or controller reset), in slot order.
    #[cfg(test)]
    pub fn drain(&mut self, f: impl FnMut(u64, Option<B>)) {
        self.drain_up_to(usize::MAX, f);
    }

    /// Complete up to `max` busy slots, in slot order; returns how many.
    /// Each slot is freed before `f` sees it, so if `f` panics the slots
    /// it was given are done and the rest stay busy for a later call.
    pub fn drain_up_to(&mut self, max: usize, mut f: impl FnMut(u64, Option<B>)) -> usize {
        let mut n = 0;
        for i in 0..self.slots.len() {
            if n == max {
                break;
            }
            if self.slots[i].busy() {
                let (tag, buf) = self.complete(i as u16);
                n += 1;
                f(tag, buf);
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cid_carries_slot_and_generation() {
        let mut t: Trackers<u32> = Trackers::new(4);
        let s = t.alloc().unwrap();
        let cid = t.slot(s).cid();
        assert_eq!(cid & 0b11, s);
        t.arm(s, 7, Some(1), 0);
        assert_eq!(t.lookup(cid), Some(s));
        let (tag, buf) = t.complete(s);
        assert_eq!((tag, buf), (7, Some(1)));
        // A duplicate of the same CID no longer matches.
        assert_eq!(t.lookup(cid), None);
        // The slot is reused with a new generation; the old CID stays stale.
        let s2 = t.alloc().unwrap();
        assert_eq!(s2, s);
        t.arm(s2, 8, None, 0);
        assert_ne!(t.slot(s2).cid(), cid);
        assert_eq!(t.lookup(cid), None);
        assert_eq!(t.lookup(t.slot(s2).cid()), Some(s2));
    }

    #[test]
    fn never_hands_out_reserved_cid() {
        // depth 4096: 12 slot bits, 4 generation bits; slot 4095 hits FFFFh.
        let mut t: Trackers<()> = Trackers::new(4096);
        let slots: Vec<u16> = (0..4096).map(|_| t.alloc().unwrap()).collect();
        assert!(t.alloc().is_none());
        let last = *slots.iter().max().unwrap();
        for s in &slots {
            if *s != last {
                t.unreserve(*s);
            }
        }
        let mut slot = last;
        for _ in 0..64 {
            assert_ne!(t.slot(slot).cid(), CID_RESERVED);
            t.arm(slot, 0, None, 0);
            t.complete(slot);
            // LIFO free list: the slot just completed comes back first.
            slot = t.alloc().unwrap();
            assert_eq!(slot, last);
        }
    }

    /// Model-based check of completion matching: under any interleaving of
    /// submissions, completions, duplicate/stale CQEs of earlier commands
    /// and garbage CIDs, the tracker accepts exactly the CIDs of commands in
    /// flight, each for its own tag, and never hands out a CID twice at once
    /// or the reserved FFFFh.
    #[derive(Clone, Debug)]
    enum Op {
        Submit,
        /// Complete the i-th (mod len) command in flight.
        Complete(usize),
        /// A CQE repeating the i-th (mod len) CID ever completed.
        Stale(usize),
        /// A CQE with an arbitrary CID.
        Garbage(u16),
        /// Queue deleted / controller reset.
        Drain,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => Just(Op::Submit),
            3 => any::<usize>().prop_map(Op::Complete),
            2 => any::<usize>().prop_map(Op::Stale),
            2 => any::<u16>().prop_map(Op::Garbage),
            1 => Just(Op::Drain),
        ]
    }

    fn check_stream(depth: u16, ops: &[Op]) {
        use std::collections::BTreeMap;
        let mut t: Trackers<u64> = Trackers::new(depth);
        // cid -> tag of commands in flight.
        let mut live: BTreeMap<u16, u64> = BTreeMap::new();
        let mut done: Vec<u16> = Vec::new();
        let mut next_tag = 0u64;
        // Feed one CQE: deliver iff it matches a live command, to that command.
        let cqe = |t: &mut Trackers<u64>,
                   live: &mut BTreeMap<u16, u64>,
                   done: &mut Vec<u16>,
                   cid: u16| {
            match t.lookup(cid) {
                Some(slot) => {
                    let want = live
                        .remove(&cid)
                        .expect("delivered a CQE that matches no command in flight");
                    let (tag, buf) = t.complete(slot);
                    assert_eq!(tag, want, "delivered to the wrong command");
                    assert_eq!(buf, Some(want), "handed back the wrong buffer");
                    done.push(cid);
                }
                None => assert!(
                    !live.contains_key(&cid),
                    "refused the CQE of a command in flight"
                ),
            }
        };
        for op in ops {
            match *op {
                Op::Submit => match t.alloc() {
                    Some(slot) => {
                        let cid = t.slot(slot).cid();
                        assert_ne!(cid, CID_RESERVED);
                        assert_eq!(cid & t.slot_mask, slot);
                        assert!(!live.contains_key(&cid), "CID {cid:#x} handed out twice");
                        t.arm(slot, next_tag, Some(next_tag), 0);
                        live.insert(cid, next_tag);
                        next_tag += 1;
                    }
                    None => assert_eq!(live.len(), depth as usize),
                },
                Op::Complete(i) if !live.is_empty() => {
                    let cid = *live.keys().nth(i % live.len()).unwrap();
                    cqe(&mut t, &mut live, &mut done, cid);
                }
                Op::Stale(i) if !done.is_empty() => {
                    let cid = done[i % done.len()];
                    cqe(&mut t, &mut live, &mut done, cid);
                }
                Op::Garbage(cid) => cqe(&mut t, &mut live, &mut done, cid),
                Op::Drain => {
                    let mut tags = Vec::new();
                    t.drain(|tag, buf| {
                        assert_eq!(buf, Some(tag));
                        tags.push(tag);
                    });
                    tags.sort();
                    let mut want: Vec<u64> = live.values().copied().collect();
                    want.sort();
                    assert_eq!(tags, want, "drain completes exactly the commands in flight");
                    live.clear();
                }
                _ => {}
            }
            assert_eq!(t.outstanding(), live.len());
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 96 },
            ..Default::default()
        })]
        #[test]
        fn cqe_streams_reach_only_their_command(
            depth in proptest::prop_oneof![1u16..=8, 9u16..=64, proptest::strategy::Just(4096u16)],
            ops in proptest::collection::vec(op(), 0..if cfg!(miri) { 64 } else { 400 }),
        ) {
            check_stream(depth, &ops);
        }
    }

    /// The slots past the depth (up to the next power of two, there so a
    /// CID's slot bits index without a bounds check) are never handed out
    /// and never match a completion.
    #[test]
    fn slots_past_the_depth_are_never_handed_out_or_matched() {
        let mut t: Trackers<()> = Trackers::new(5);
        assert_eq!((t.slots(), t.slots.len()), (5, 8));
        let mut got = Vec::new();
        while let Some(s) = t.alloc() {
            t.arm(s, 0, None, 0);
            got.push(s);
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3, 4]);
        for slot in 5u16..8 {
            for generation in 0u16..(1 << 13) {
                assert_eq!(t.lookup(slot | generation << 3), None);
            }
        }
        // Busy and CID in one compare: a free slot's next CID never matches.
        let s = got[0];
        let cid = t.slot(s).cid();
        assert_eq!(t.lookup(cid), Some(s));
        t.complete(s);
        assert_eq!(t.lookup(cid), None);
        assert_eq!(t.lookup(t.slot(s).cid()), None);
        assert!(!t.slot(s).busy());
    }

    /// A slot freed twice would be handed to two commands: the free list
    /// never grows past the depth to take it.
    #[test]
    #[should_panic]
    fn a_slot_freed_twice_panics() {
        let mut t: Trackers<()> = Trackers::new(1);
        let s = t.alloc().unwrap();
        t.unreserve(s);
        t.unreserve(s);
    }

    #[test]
    fn drain_up_to_stops_at_max_and_resumes() {
        let mut t: Trackers<u8> = Trackers::new(8);
        for i in 0..5 {
            let s = t.alloc().unwrap();
            t.arm(s, i, Some(i as u8), 0);
        }
        let mut seen = vec![];
        assert_eq!(t.drain_up_to(0, |tag, _| seen.push(tag)), 0);
        assert_eq!(t.drain_up_to(2, |tag, _| seen.push(tag)), 2);
        assert_eq!(t.outstanding(), 3);
        assert_eq!(t.drain_up_to(usize::MAX, |tag, _| seen.push(tag)), 3);
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn a_retired_slot_is_never_handed_out_until_unretired() {
        let mut t: Trackers<u8> = Trackers::new(2);
        let a = t.alloc().unwrap();
        let cid = t.slot(a).cid();
        t.arm(a, 1, Some(1), 0);
        assert_eq!(t.retire(a), (1, Some(1)));
        assert_eq!(t.lookup(cid), None, "a late completion is stale");
        assert_eq!((t.depth(), t.outstanding()), (1, 0));
        let b = t.alloc().unwrap();
        assert_ne!(b, a);
        assert!(t.alloc().is_none());
        t.unreserve(b);
        t.unretire_all();
        assert_eq!((t.depth(), t.outstanding()), (2, 0));
        let mut got = vec![t.alloc().unwrap(), t.alloc().unwrap()];
        got.sort();
        assert_eq!(got, vec![0, 1]);
    }

    #[test]
    fn drain_completes_each_busy_slot_once() {
        let mut t: Trackers<u8> = Trackers::new(8);
        for i in 0..5 {
            let s = t.alloc().unwrap();
            t.arm(s, i, Some(i as u8), 0);
        }
        let mut seen = vec![];
        t.drain(|tag, _| seen.push(tag));
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        assert_eq!(t.outstanding(), 0);
    }

    /// Every slot is handed out at most once at a time: `depth()` allocs
    /// give distinct slots, then none.
    fn assert_free_list_sound<B>(t: &mut Trackers<B>, held: &[u16]) {
        let mut got: Vec<u16> = held.to_vec();
        while let Some(s) = t.alloc() {
            assert!(!got.contains(&s), "slot {s} handed out twice");
            got.push(s);
            assert!(got.len() <= t.depth(), "more slots than the depth");
        }
        for &s in &got[held.len()..] {
            t.unreserve(s);
        }
    }

    /// Issue 27 item 9 (g): a reset (`unretire_all`) between `alloc` and
    /// `arm` must not put the reserved slot on the free list: once armed and
    /// completed (or unreserved) it would be there twice, and two commands
    /// would share a slot. Both transports' patterns: NVMe (reserve, then
    /// arm or unreserve; children of a split reserved together) and UFS
    /// (plus retire on a failed timeout reset, unretire on the next reset).
    #[test]
    fn a_reset_between_reserve_and_arm_frees_no_slot_twice() {
        // Arm after the reset, then complete.
        let mut t: Trackers<u8> = Trackers::new(4);
        let old = t.alloc().unwrap();
        t.arm(old, 1, None, 0);
        t.retire(old);
        let reserved = t.alloc().unwrap();
        t.unretire_all();
        assert_eq!(t.outstanding(), 1, "the reserved slot is still taken");
        t.arm(reserved, 2, None, 0);
        t.complete(reserved);
        assert_eq!(t.outstanding(), 0);
        assert_free_list_sound(&mut t, &[]);

        // Unreserve after the reset (a refused submission; several children).
        let mut t: Trackers<u8> = Trackers::new(8);
        let old = t.alloc().unwrap();
        t.arm(old, 1, None, 0);
        t.retire(old);
        let children: Vec<u16> = (0..3).map(|_| t.alloc().unwrap()).collect();
        t.unretire_all();
        for &c in children.iter().rev() {
            t.unreserve(c);
        }
        assert_eq!(t.outstanding(), 0);
        assert_free_list_sound(&mut t, &[]);

        // No retired slot at all: unretire_all is a no-op for reserved ones.
        let mut t: Trackers<u8> = Trackers::new(2);
        let r = t.alloc().unwrap();
        t.unretire_all();
        assert_free_list_sound(&mut t, &[r]);
        t.arm(r, 0, None, 0);
        t.complete(r);
        assert_free_list_sound(&mut t, &[]);
    }

    /// The same as a model over random streams of every wire's moves.
    #[derive(Clone, Debug)]
    enum Life {
        /// Reserve a slot (held, not armed).
        Reserve,
        /// Arm the i-th held slot.
        Arm(usize),
        /// Give the i-th held slot back unarmed.
        Unreserve(usize),
        /// Complete the i-th armed slot.
        Complete(usize),
        /// Retire the i-th armed slot (a failed timeout reset).
        Retire(usize),
        /// A successful reset: end every armed slot, unretire all.
        Reset,
    }

    fn life() -> impl proptest::strategy::Strategy<Value = Life> {
        use proptest::prelude::*;
        prop_oneof![
            4 => Just(Life::Reserve),
            3 => any::<usize>().prop_map(Life::Arm),
            1 => any::<usize>().prop_map(Life::Unreserve),
            3 => any::<usize>().prop_map(Life::Complete),
            1 => any::<usize>().prop_map(Life::Retire),
            1 => Just(Life::Reset),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 128 },
            ..Default::default()
        })]
        #[test]
        fn reserve_arm_retire_reset_never_share_a_slot(
            depth in 1u16..=8,
            ops in proptest::collection::vec(life(), 0..200),
        ) {
            let mut t: Trackers<()> = Trackers::new(depth);
            let (mut held, mut armed, mut retired) = (Vec::new(), Vec::new(), Vec::new());
            for op in ops {
                match op {
                    Life::Reserve => {
                        if let Some(s) = t.alloc() {
                            assert!(!held.contains(&s) && !armed.contains(&s) && !retired.contains(&s),
                                "slot {s} handed out while in use");
                            held.push(s);
                        }
                    }
                    Life::Arm(i) if !held.is_empty() => {
                        let s = held.remove(i % held.len());
                        t.arm(s, 0, None, 0);
                        armed.push(s);
                    }
                    Life::Unreserve(i) if !held.is_empty() => t.unreserve(held.remove(i % held.len())),
                    Life::Complete(i) if !armed.is_empty() => {
                        t.complete(armed.remove(i % armed.len()));
                    }
                    Life::Retire(i) if !armed.is_empty() => {
                        let s = armed.remove(i % armed.len());
                        t.retire(s);
                        retired.push(s);
                    }
                    Life::Reset => {
                        t.drain(|_, _| {});
                        armed.clear();
                        t.unretire_all();
                        retired.clear();
                    }
                    _ => {}
                }
                assert_eq!(t.outstanding(), held.len() + armed.len());
                assert_eq!(t.depth(), usize::from(depth) - retired.len());
            }
            let in_use: Vec<u16> = held.iter().chain(&armed).copied().collect();
            assert_free_list_sound(&mut t, &in_use);
        }
    }
}
