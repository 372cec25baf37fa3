//! Which regions and sub-regions of an LU the host keeps: activation (host
//! control: read counters against a threshold, with normalisation;
//! device control: the device's recommendations), the LRU of active
//! regions under the memory budget and the device's active-region limit,
//! eviction thresholds, pinned regions, and the queue of map loads.
//!
//! Runs under the LU's policy mutex, which queue pairs only ever
//! `try_lock` from their poll (never on the submit path, never waiting).
//! State words change here with compare-and-swap, because the submit path
//! of other threads may dirty the same words at the same time.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::map::{gen_of, slot_of, with_slot, LuMap, ACTIVE, GEN_ONE, LOADING, VALID};
use super::HpbControl;

/// No WRITE BUFFER pending for the region.
const WB_NONE: u8 = 0;
/// Its WRITE BUFFER waits in the queue (activating it again cancels it).
const WB_QUEUED: u8 = 1;
/// Its WRITE BUFFER is in flight: it is not activated again before that
/// completes (the device could run a new READ BUFFER first and then
/// inactivate the region under entries the host trusts).
const WB_POSTED: u8 = 2;

/// The mutable policy state of one LU.
pub(crate) struct Policy {
    /// Slots given back by evictions.
    free: Vec<u32>,
    /// Slots never used yet: `next_new..slots`.
    next_new: u32,
    slots: u32,
    /// Per region: active on the host (holds or may hold entries).
    active: Vec<bool>,
    /// Active regions, pinned ones included.
    active_count: usize,
    /// The device's wLUMaxActiveHPBRegions (pinned included; 0 = no limit).
    max_active: u32,
    pinned: Range<u32>,
    pinned_done: bool,
    /// Per sub-region: waiting in `pending`.
    queued: Vec<bool>,
    /// Sub-regions to load (READ BUFFER), oldest first.
    pending: VecDeque<u32>,
    /// Regions to evict once their loads in flight end.
    deferred: Vec<u32>,
    /// Host control: regions to inactivate on the device (WRITE BUFFER).
    wb: VecDeque<u16>,
    /// Per region: [`WB_NONE`], [`WB_QUEUED`] (in `wb`) or [`WB_POSTED`].
    wb_state: Vec<u8>,
    /// Host control: reads since the last normalisation.
    reads_since_norm: u64,
}

impl Policy {
    pub(crate) fn new(
        srgns: usize,
        regions: usize,
        slots: u32,
        max_active: u32,
        pinned: Range<u32>,
    ) -> Self {
        Policy {
            free: Vec::new(),
            next_new: 0,
            slots,
            active: vec![false; regions],
            active_count: 0,
            max_active,
            pinned,
            pinned_done: false,
            queued: vec![false; srgns],
            pending: VecDeque::new(),
            deferred: Vec::new(),
            wb: VecDeque::new(),
            wb_state: vec![WB_NONE; regions],
            reads_since_norm: 0,
        }
    }

    pub(crate) fn active_count(&self) -> usize {
        self.active_count
    }

    fn is_pinned(&self, r: usize) -> bool {
        self.pinned.contains(&(r as u32))
    }

    /// Sum of the read counters of region `r`.
    fn region_reads(m: &LuMap, r: usize) -> u64 {
        m.region_srgns(r)
            .map(|s| u64::from(m.reads[s].load(Ordering::Relaxed)))
            .sum()
    }

    /// One pass's housekeeping: pinned regions, deferred evictions.
    pub(crate) fn tick(&mut self, m: &LuMap) {
        m.clock.fetch_add(1, Ordering::Relaxed);
        if !self.pinned_done {
            self.pinned_done = true;
            for r in self.pinned.clone() {
                for s in m.region_srgns(r as usize) {
                    if self.activate(m, s) {
                        self.queue(s);
                    }
                }
            }
        }
        if !self.deferred.is_empty() {
            let d = std::mem::take(&mut self.deferred);
            for r in d {
                if !self.evict(m, r as usize, false) && self.active[r as usize] {
                    self.deferred.push(r);
                }
            }
        }
    }

    fn queue(&mut self, s: usize) {
        if !self.queued[s] {
            self.queued[s] = true;
            self.pending.push_back(s as u32);
        }
    }

    /// Give sub-region `s` a slot (and its region the active state),
    /// evicting the least recently used region if the budget or the
    /// device's limit requires it. False if nothing could be evicted.
    fn activate(&mut self, m: &LuMap, s: usize) -> bool {
        let w = m.words[s].load(Ordering::Acquire);
        if w & ACTIVE != 0 {
            return true;
        }
        let r = m.region_of(s);
        match self.wb_state[r] {
            WB_POSTED => return false,
            WB_QUEUED => {
                self.wb.retain(|&x| usize::from(x) != r);
                self.wb_state[r] = WB_NONE;
            }
            _ => {}
        }
        let full = self.max_active != 0 && self.active_count as u32 >= self.max_active;
        if !self.active[r] && full && !self.evict_lru(m, r) {
            return false;
        }
        let slot = match self.free.pop() {
            Some(x) => x,
            None if self.next_new < self.slots => {
                let x = self.next_new;
                self.next_new += 1;
                let n = m.srgn_entries() as usize;
                m.slab[x as usize].get_or_init(|| (0..n).map(|_| AtomicU64::new(0)).collect());
                m.c.map_bytes.fetch_add(8 * n as u64, Ordering::Relaxed);
                x
            }
            None => {
                if !self.evict_lru(m, r) {
                    return false;
                }
                match self.free.pop() {
                    Some(x) => x,
                    None => return false,
                }
            }
        };
        // Only the policy sets ACTIVE: other threads may only bump the
        // generation (dirty) of an active word, so `w` is still unused;
        // retry for a concurrent generation change anyway.
        let mut cur = w;
        loop {
            let n = with_slot(cur, slot, ACTIVE).wrapping_add(GEN_ONE);
            match m.words[s].compare_exchange_weak(cur, n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(c) => cur = c,
            }
        }
        if !self.active[r] {
            self.active[r] = true;
            self.active_count += 1;
        }
        m.stamps[r].store(m.clock.load(Ordering::Relaxed), Ordering::Relaxed);
        let used =
            m.c.map_bytes_used
                .fetch_add(8 << m.srgn_shift, Ordering::Relaxed)
                + (8 << m.srgn_shift);
        m.c.map_bytes_peak.fetch_max(used, Ordering::Relaxed);
        true
    }

    /// Evict the least recently used region that may go (not `keep`, not
    /// pinned, no load in flight; host control: at most
    /// `eviction_exit` reads, and `keep` at least `eviction_enter`).
    fn evict_lru(&mut self, m: &LuMap, keep: usize) -> bool {
        if m.control == HpbControl::Host
            && Self::region_reads(m, keep) < u64::from(m.cfg.eviction_enter)
        {
            return false;
        }
        let mut best: Option<(u64, usize)> = None;
        for r in 0..self.active.len() {
            if !self.active[r] || r == keep || self.is_pinned(r) {
                continue;
            }
            if m.region_srgns(r)
                .any(|s| m.words[s].load(Ordering::Acquire) & LOADING != 0)
            {
                continue;
            }
            if m.control == HpbControl::Host
                && Self::region_reads(m, r) > u64::from(m.cfg.eviction_exit)
            {
                continue;
            }
            let st = m.stamps[r].load(Ordering::Relaxed);
            if best.is_none_or(|(b, _)| st < b) {
                best = Some((st, r));
            }
        }
        match best {
            Some((_, r)) => self.evict(m, r, true),
            None => false,
        }
    }

    /// Drop region `r`'s entries and slots. False (nothing changed) while a
    /// load of one of its sub-regions is in flight. `tell`: host control
    /// sends WRITE BUFFER so the device inactivates it too.
    pub(crate) fn evict(&mut self, m: &LuMap, r: usize, tell: bool) -> bool {
        if r >= self.active.len() || !self.active[r] || self.is_pinned(r) {
            return false;
        }
        let srgns = m.region_srgns(r);
        if srgns
            .clone()
            .any(|s| m.words[s].load(Ordering::Acquire) & LOADING != 0)
        {
            return false;
        }
        for s in srgns {
            let mut cur = m.words[s].load(Ordering::Acquire);
            while cur & ACTIVE != 0 {
                // Unused, next generation: a reader that saw the old word
                // fails its re-check before the slot is reused.
                let n = (cur & !((1u64 << 32) - 1)).wrapping_add(GEN_ONE);
                match m.words[s].compare_exchange_weak(cur, n, Ordering::AcqRel, Ordering::Relaxed)
                {
                    Ok(_) => {
                        self.free.push(slot_of(cur));
                        m.c.map_bytes_used
                            .fetch_sub(8 << m.srgn_shift, Ordering::Relaxed);
                        break;
                    }
                    Err(c) => cur = c,
                }
            }
            self.queued[s] = false;
        }
        self.active[r] = false;
        self.active_count -= 1;
        m.c.evictions.fetch_add(1, Ordering::Relaxed);
        if tell && m.control == HpbControl::Host && self.wb_state[r] == WB_NONE {
            self.wb_state[r] = WB_QUEUED;
            self.wb.push_back(r as u16);
        }
        true
    }

    /// The next sub-region to load, marked LOADING: (index, generation).
    pub(crate) fn next_load(&mut self, m: &LuMap) -> Option<(u32, u32)> {
        while let Some(s) = self.pending.pop_front() {
            let i = s as usize;
            self.queued[i] = false;
            let mut cur = m.words[i].load(Ordering::Acquire);
            loop {
                if cur & ACTIVE == 0 || cur & (VALID | LOADING) != 0 {
                    break;
                }
                match m.words[i].compare_exchange_weak(
                    cur,
                    cur | LOADING,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Some((s, gen_of(cur))),
                    Err(c) => cur = c,
                }
            }
        }
        None
    }

    /// The next WRITE BUFFER inactivation to post (marked posted).
    pub(crate) fn next_inactivation(&mut self) -> Option<u16> {
        let r = self.wb.pop_front()?;
        self.wb_state[usize::from(r)] = WB_POSTED;
        Some(r)
    }

    /// The WRITE BUFFER of region `r` ended (or could not be posted:
    /// `again` queues it again).
    pub(crate) fn inactivation_done(&mut self, r: u16, again: bool) {
        if let Some(st) = self.wb_state.get_mut(usize::from(r)) {
            if again && !self.active[usize::from(r)] {
                *st = WB_QUEUED;
                self.wb.push_front(r);
            } else {
                *st = WB_NONE;
            }
        }
    }

    /// A load could not be posted: give it back (LOADING cleared, queued
    /// again at the front).
    pub(crate) fn unload(&mut self, m: &LuMap, s: u32) {
        let i = s as usize;
        m.words[i].fetch_and(!LOADING, Ordering::AcqRel);
        if !self.queued[i] {
            self.queued[i] = true;
            self.pending.push_front(s);
        }
    }

    /// Host control: a read made sub-region `s` hot.
    pub(crate) fn candidate(&mut self, m: &LuMap, s: usize) {
        if s >= m.words.len() {
            return;
        }
        let w = m.words[s].load(Ordering::Acquire);
        if w & (VALID | LOADING) != 0 {
            return;
        }
        if m.reads[s].load(Ordering::Relaxed) < m.cfg.activation_threshold {
            return;
        }
        if self.activate(m, s) {
            self.queue(s);
        }
    }

    /// A load of `s` ended without publishing (dirtied meanwhile, or
    /// failed): load it again.
    pub(crate) fn reload(&mut self, m: &LuMap, s: usize) {
        if s < m.words.len() && m.words[s].load(Ordering::Acquire) & ACTIVE != 0 {
            self.queue(s);
        }
    }

    /// The device recommends loading (`rgn`, `srgn`) (an activation, or an
    /// update after a write). Device control: activate if needed. Host
    /// control: only updates of sub-regions already active are followed.
    pub(crate) fn rec_active(&mut self, m: &LuMap, rgn: u16, srgn: u16) -> bool {
        let s = (usize::from(rgn) << m.per_rgn_shift) + usize::from(srgn);
        if usize::from(srgn) >= 1 << m.per_rgn_shift || s >= m.words.len() {
            return false;
        }
        let w = m.words[s].load(Ordering::Acquire);
        if w & ACTIVE != 0 {
            // Its entries changed on the device: stop using them now.
            m.dirty(s as u64 * m.srgn_entries(), 1);
            self.queue(s);
        } else if m.control == HpbControl::Device && self.activate(m, s) {
            self.queue(s);
        }
        true
    }

    /// The device recommends inactivating region `rgn` (device control
    /// only; host control ignores it).
    pub(crate) fn rec_inactive(&mut self, m: &LuMap, rgn: u16) -> bool {
        let r = usize::from(rgn);
        if r >= self.active.len() {
            return false;
        }
        if m.control == HpbControl::Device && !self.evict(m, r, false) && self.active[r] {
            // Loads in flight: no entry of it is used from now on, and it
            // goes once they end.
            for s in m.region_srgns(r) {
                m.dirty(s as u64 * m.srgn_entries(), 1);
            }
            self.deferred.push(r as u32);
        }
        true
    }

    /// The device reset its map: every entry the host holds is suspect;
    /// reload every active sub-region.
    pub(crate) fn rec_reset(&mut self, m: &LuMap) {
        for s in 0..m.words.len() {
            if m.words[s].load(Ordering::Acquire) & ACTIVE != 0 {
                m.dirty(s as u64 * m.srgn_entries(), 1);
                self.queue(s);
            }
        }
    }

    /// Host control: count `n` reads; past `normalize_interval`, divide
    /// every counter by `2^normalization_factor` and inactivate the active
    /// regions left with no reads.
    pub(crate) fn count_reads(&mut self, m: &LuMap, n: u64) {
        if m.control != HpbControl::Host || m.cfg.normalize_interval == 0 {
            return;
        }
        self.reads_since_norm += n;
        if self.reads_since_norm < m.cfg.normalize_interval {
            return;
        }
        self.reads_since_norm = 0;
        m.c.normalizations.fetch_add(1, Ordering::Relaxed);
        let f = m.cfg.normalization_factor.min(31);
        for c in m.reads.iter() {
            c.store(c.load(Ordering::Relaxed) >> f, Ordering::Relaxed);
        }
        for r in 0..self.active.len() {
            if self.active[r] && !self.is_pinned(r) && Self::region_reads(m, r) == 0 {
                self.evict(m, r, true);
            }
        }
    }
}
