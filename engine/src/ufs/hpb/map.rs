//! One LU's host copy of the device's L2P map: per sub-region state words,
//! entry arrays in slots bounded by the memory budget, read counters and
//! per-region LRU stamps. Shared by every queue pair (`Arc<LuMap>`); the
//! hot path only loads and compares-and-swaps atomics (see the
//! [module docs](super) for the publication scheme).

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::policy::Policy;
use super::{HpbConfig, HpbControl, HpbStats};

/// State-word flag: the sub-region owns an entry slot (region active).
pub(crate) const ACTIVE: u64 = 1 << 0;
/// State-word flag: the slot holds entries current as of the word's
/// generation.
pub(crate) const VALID: u64 = 1 << 1;
/// State-word flag: a READ BUFFER for this sub-region is in flight; its slot
/// must not be freed or reused.
pub(crate) const LOADING: u64 = 1 << 2;
const SLOT_SHIFT: u32 = 8;
const SLOT_MASK: u64 = 0xFF_FFFF;
const GEN_SHIFT: u32 = 32;
/// Adds one to the generation field.
pub(crate) const GEN_ONE: u64 = 1 << GEN_SHIFT;
/// Most entry slots per LU (24-bit slot field).
pub(crate) const MAX_SLOTS: u64 = SLOT_MASK;

#[inline(always)]
pub(crate) fn slot_of(w: u64) -> u32 {
    ((w >> SLOT_SHIFT) & SLOT_MASK) as u32
}

#[inline(always)]
pub(crate) fn gen_of(w: u64) -> u32 {
    (w >> GEN_SHIFT) as u32
}

/// A word with `slot` and `flags`, keeping `w`'s generation.
#[inline(always)]
pub(crate) fn with_slot(w: u64, slot: u32, flags: u64) -> u64 {
    (w & !((1 << GEN_SHIFT) - 1)) | u64::from(slot) << SLOT_SHIFT | flags
}

/// Counters shared by the queue pairs of one LU.
#[derive(Default)]
pub(crate) struct Shared {
    pub hpb_reads: AtomicU64,
    pub normal_reads: AtomicU64,
    pub map_loads: AtomicU64,
    pub map_load_errors: AtomicU64,
    pub map_loads_discarded: AtomicU64,
    pub internal_timeouts: AtomicU64,
    pub internal_given_up: AtomicU64,
    pub stale_fallbacks: AtomicU64,
    pub evictions: AtomicU64,
    pub inactivations_sent: AtomicU64,
    pub active_recs: AtomicU64,
    pub inactive_recs: AtomicU64,
    pub reset_notices: AtomicU64,
    pub bad_recs: AtomicU64,
    pub dirtied: AtomicU64,
    pub normalizations: AtomicU64,
    /// Entry bytes allocated (slots ever used × sub-region bytes).
    pub map_bytes: AtomicU64,
    /// Entry bytes held by active sub-regions now.
    pub map_bytes_used: AtomicU64,
    pub map_bytes_peak: AtomicU64,
}

/// What a read lookup found.
pub(crate) enum Lookup {
    /// A current entry for the first block: send HPB READ.
    Hit(u64),
    /// Send a normal READ; `true` if this read made its sub-region a
    /// candidate for (re)loading (host control).
    Miss(bool),
}

/// The host map of one HPB LU.
pub(crate) struct LuMap {
    pub lun: u8,
    pub control: HpbControl,
    pub blocks: u64,
    /// log2 of entries (4 KiB blocks) per sub-region.
    pub srgn_shift: u32,
    /// log2 of sub-regions per region.
    pub per_rgn_shift: u32,
    /// Blocks one HPB READ may move.
    pub max_single: u32,
    pub cfg: HpbConfig,
    /// Per sub-region state word: generation | slot | flags.
    pub words: Box<[AtomicU64]>,
    /// Per sub-region read counter (host control; lossy increments).
    pub reads: Box<[AtomicU32]>,
    /// Per region: LRU stamp of its last HPB use.
    pub stamps: Box<[AtomicU64]>,
    /// Entry arrays, one per slot, allocated on first use and then reused.
    pub slab: Box<[OnceLock<Box<[AtomicU64]>>]>,
    /// The LRU clock (advanced by every policy pass).
    pub clock: AtomicU64,
    pub c: Shared,
    policy: Mutex<Policy>,
}

impl LuMap {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        lun: u8,
        control: HpbControl,
        blocks: u64,
        srgn_shift: u32,
        per_rgn_shift: u32,
        max_single: u32,
        max_active: u32,
        pinned: std::ops::Range<u32>,
        cfg: HpbConfig,
    ) -> Self {
        let srgns = blocks.div_ceil(1 << srgn_shift) as usize;
        let regions = srgns.div_ceil(1 << per_rgn_shift) as u32;
        let srgn_bytes = 8u64 << srgn_shift;
        let slots = (cfg.memory_budget / srgn_bytes)
            .min(MAX_SLOTS)
            .min(srgns as u64) as u32;
        let pinned = pinned.start.min(regions)..pinned.end.min(regions);
        LuMap {
            lun,
            control,
            blocks,
            srgn_shift,
            per_rgn_shift,
            max_single,
            words: (0..srgns).map(|_| AtomicU64::new(0)).collect(),
            reads: (0..srgns).map(|_| AtomicU32::new(0)).collect(),
            stamps: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            slab: (0..slots).map(|_| OnceLock::new()).collect(),
            clock: AtomicU64::new(1),
            c: Shared::default(),
            policy: Mutex::new(Policy::new(
                srgns,
                regions as usize,
                slots,
                max_active,
                pinned,
            )),
            cfg,
        }
    }

    /// Entries per sub-region.
    #[inline(always)]
    pub(crate) fn srgn_entries(&self) -> u64 {
        1 << self.srgn_shift
    }

    /// Entries (blocks) of sub-region `s` (the last one may be short).
    pub(crate) fn srgn_len(&self, s: usize) -> u64 {
        let first = (s as u64) << self.srgn_shift;
        self.srgn_entries().min(self.blocks.saturating_sub(first))
    }

    /// (region, sub-region in region) of sub-region index `s`.
    pub(crate) fn split(&self, s: usize) -> (u16, u16) {
        (
            (s >> self.per_rgn_shift) as u16,
            (s & ((1 << self.per_rgn_shift) - 1)) as u16,
        )
    }

    pub(crate) fn region_of(&self, s: usize) -> usize {
        s >> self.per_rgn_shift
    }

    pub(crate) fn region_srgns(&self, r: usize) -> std::ops::Range<usize> {
        let first = r << self.per_rgn_shift;
        first..(first + (1 << self.per_rgn_shift)).min(self.words.len())
    }

    /// The policy, if no other queue pair holds it now (never blocks).
    pub(crate) fn try_policy(&self) -> Option<MutexGuard<'_, Policy>> {
        match self.policy.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The policy, waiting for it (set-up and tests only).
    pub(crate) fn policy(&self) -> MutexGuard<'_, Policy> {
        self.policy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The hot path of a read of `blocks` at `lba` (range checked by the
    /// caller): an entry to send, or why not.
    #[inline]
    pub(crate) fn lookup(&self, lba: u64, blocks: u32) -> Lookup {
        if blocks == 0 || blocks > self.max_single || lba > u64::from(u32::MAX) {
            return Lookup::Miss(false);
        }
        let s = (lba >> self.srgn_shift) as usize;
        let Some(word) = self.words.get(s) else {
            return Lookup::Miss(false);
        };
        let mut hot = false;
        if self.control == HpbControl::Host {
            // Lossy on purpose: a plain load and store, no locked RMW on a
            // line other threads write too. A lost increment only delays an
            // activation.
            let c = self.reads[s].load(Ordering::Relaxed).saturating_add(1);
            self.reads[s].store(c, Ordering::Relaxed);
            hot = c >= self.cfg.activation_threshold;
        }
        // Acquire: pairs with the Release publish of VALID, so the entries
        // stored before it are visible to the loads below.
        let w1 = word.load(Ordering::Acquire);
        if w1 & (ACTIVE | VALID) != ACTIVE | VALID {
            return Lookup::Miss(hot && w1 & (VALID | LOADING) == 0);
        }
        let last = ((lba + u64::from(blocks) - 1) >> self.srgn_shift) as usize;
        for t in s + 1..=last {
            match self.words.get(t) {
                Some(w) if w.load(Ordering::Acquire) & VALID != 0 => {}
                _ => return Lookup::Miss(false),
            }
        }
        let Some(arr) = self.slab.get(slot_of(w1) as usize).and_then(OnceLock::get) else {
            return Lookup::Miss(false);
        };
        let Some(e) = arr.get((lba & (self.srgn_entries() - 1)) as usize) else {
            return Lookup::Miss(false);
        };
        let e = e.load(Ordering::Relaxed);
        // Acquire fence: the entry load above is ordered before the
        // re-check below; if the word is unchanged, no writer dirtied,
        // evicted or reloaded the sub-region in between (seqlock read).
        fence(Ordering::Acquire);
        if word.load(Ordering::Relaxed) != w1 {
            return Lookup::Miss(false);
        }
        let r = s >> self.per_rgn_shift;
        let now = self.clock.load(Ordering::Relaxed);
        if self.stamps[r].load(Ordering::Relaxed) != now {
            self.stamps[r].store(now, Ordering::Relaxed);
        }
        Lookup::Hit(e)
    }

    /// A write, unmap or write-zeroes of `[lba, lba + blocks)` is about to
    /// be posted: every active sub-region it touches loses VALID and gets a
    /// new generation, so no reader sends its entries and an in-flight load
    /// of it is not published.
    #[inline]
    pub(crate) fn dirty(&self, lba: u64, blocks: u32) {
        if blocks == 0 {
            return;
        }
        let first = (lba >> self.srgn_shift) as usize;
        let last = ((lba + u64::from(blocks) - 1) >> self.srgn_shift) as usize;
        for s in first..=last.min(self.words.len().saturating_sub(1)) {
            let word = &self.words[s];
            let mut w = word.load(Ordering::Relaxed);
            while w & ACTIVE != 0 {
                let n = (w & !VALID).wrapping_add(GEN_ONE);
                // AcqRel: the new generation is ordered before the command
                // is posted (the doorbell store is a Release that follows).
                match word.compare_exchange_weak(w, n, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => {
                        self.c.dirtied.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(cur) => w = cur,
                }
            }
        }
    }

    /// A READ BUFFER of sub-region `s`, issued at generation `gen`, ended:
    /// with `entries` (big-endian, as the device sent them) on success.
    /// Publishes them unless the sub-region was dirtied since; returns
    /// whether it did.
    pub(crate) fn finish_load(&self, s: usize, gen: u32, entries: Option<&[u8]>) -> bool {
        let word = &self.words[s];
        let w = word.load(Ordering::Acquire);
        let ok = match entries {
            Some(bytes) if gen_of(w) == gen && w & LOADING != 0 => {
                match self.slab.get(slot_of(w) as usize).and_then(OnceLock::get) {
                    Some(arr) => {
                        for (e, b) in arr.iter().zip(bytes.chunks_exact(8)) {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(b);
                            e.store(u64::from_be_bytes(a), Ordering::Relaxed);
                        }
                        true
                    }
                    None => false,
                }
            }
            _ => false,
        };
        let mut cur = w;
        loop {
            let publish = ok && gen_of(cur) == gen;
            let n = if publish {
                (cur | VALID) & !LOADING
            } else {
                cur & !LOADING
            };
            // Release: the entry stores above happen before a reader's
            // Acquire load sees VALID.
            match word.compare_exchange_weak(cur, n, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return publish,
                Err(c) => cur = c,
            }
        }
    }

    /// Test knob (a broken host): replace the held entry of `lba` with
    /// `f(old)` without touching its state word, so the next HPB READ of
    /// `lba` carries it. Returns the old entry, if the sub-region is valid.
    pub(crate) fn swap_entry(&self, lba: u64, f: impl FnOnce(u64) -> u64) -> Option<u64> {
        let s = (lba >> self.srgn_shift) as usize;
        let w = self.words.get(s)?.load(Ordering::Acquire);
        if w & (ACTIVE | VALID) != ACTIVE | VALID {
            return None;
        }
        let arr = self.slab.get(slot_of(w) as usize)?.get()?;
        let e = arr.get((lba & (self.srgn_entries() - 1)) as usize)?;
        let old = e.load(Ordering::Relaxed);
        e.store(f(old), Ordering::Relaxed);
        Some(old)
    }

    /// The counters now (queue pairs add theirs at every policy pass).
    pub(crate) fn stats(&self) -> HpbStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.c;
        HpbStats {
            lun: self.lun,
            host_control: self.control == HpbControl::Host,
            hpb_reads: l(&c.hpb_reads),
            normal_reads: l(&c.normal_reads),
            map_loads: l(&c.map_loads),
            map_load_errors: l(&c.map_load_errors),
            map_loads_discarded: l(&c.map_loads_discarded),
            internal_timeouts: l(&c.internal_timeouts),
            internal_given_up: l(&c.internal_given_up),
            stale_fallbacks: l(&c.stale_fallbacks),
            evictions: l(&c.evictions),
            inactivations_sent: l(&c.inactivations_sent),
            active_recs: l(&c.active_recs),
            inactive_recs: l(&c.inactive_recs),
            reset_notices: l(&c.reset_notices),
            bad_recs: l(&c.bad_recs),
            dirtied: l(&c.dirtied),
            normalizations: l(&c.normalizations),
            host_map_bytes: l(&c.map_bytes),
            host_map_bytes_used: l(&c.map_bytes_used),
            host_map_bytes_peak: l(&c.map_bytes_peak),
            host_meta_bytes: (self.words.len() * 12 + self.stamps.len() * 8 + self.slab.len() * 8)
                as u64,
            memory_budget: self.cfg.memory_budget,
            valid_subregions: self
                .words
                .iter()
                .filter(|w| w.load(Ordering::Relaxed) & VALID != 0)
                .count() as u64,
            active_regions: self.policy().active_count() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 sub-regions of 16 entries, 2 per region; a budget of 4 slots.
    fn lu(control: HpbControl) -> LuMap {
        let cfg = HpbConfig {
            memory_budget: 4 * 16 * 8,
            activation_threshold: 2,
            eviction_enter: 0,
            eviction_exit: u32::MAX,
            ..HpbConfig::default()
        };
        LuMap::new(0, control, 128, 4, 1, 32, 0, 0..0, cfg)
    }

    fn entries(base: u64) -> Vec<u8> {
        (0..16u64).flat_map(|i| (base + i).to_be_bytes()).collect()
    }

    /// Activate and load sub-region `s` with entries `base + i`.
    fn load(m: &LuMap, s: usize, base: u64) -> bool {
        let mut p = m.policy();
        p.reload(m, s);
        for _ in 0..2 {
            m.reads[s].fetch_add(1, Ordering::Relaxed);
        }
        p.candidate(m, s);
        let Some((got, gen)) = p.next_load(m) else {
            return false;
        };
        assert_eq!(got as usize, s);
        drop(p);
        m.finish_load(s, gen, Some(&entries(base)))
    }

    #[test]
    fn loaded_entries_are_read_until_a_write_dirties_them() {
        let m = lu(HpbControl::Host);
        assert!(matches!(m.lookup(17, 1), Lookup::Miss(false)));
        assert!(load(&m, 1, 1000));
        assert!(matches!(m.lookup(17, 1), Lookup::Hit(1001)));
        assert!(matches!(m.lookup(30, 2), Lookup::Hit(1014)));
        // Crossing into sub-region 2 (not loaded): normal READ.
        assert!(matches!(m.lookup(31, 2), Lookup::Miss(_)));
        // Longer than the single-command limit: normal READ.
        assert!(matches!(m.lookup(16, 33), Lookup::Miss(false)));
        m.dirty(20, 1);
        assert!(matches!(m.lookup(17, 1), Lookup::Miss(_)));
        assert_eq!(m.stats().dirtied, 1);
    }

    #[test]
    fn a_load_dirtied_in_flight_is_not_published() {
        let m = lu(HpbControl::Host);
        let mut p = m.policy();
        m.reads[3].store(5, Ordering::Relaxed);
        p.candidate(&m, 3);
        let (s, gen) = p.next_load(&m).unwrap();
        drop(p);
        // A write to the sub-region while READ BUFFER is in flight.
        m.dirty(3 * 16 + 5, 1);
        assert!(!m.finish_load(s as usize, gen, Some(&entries(7))));
        assert!(matches!(m.lookup(3 * 16, 1), Lookup::Miss(_)));
        let w = m.words[3].load(Ordering::Relaxed);
        assert_eq!(w & (LOADING | VALID), 0, "LOADING cleared, not valid");
        assert!(w & ACTIVE != 0, "keeps its slot for the reload");
        // A failed load publishes nothing either.
        let mut p = m.policy();
        p.reload(&m, 3);
        let (s, gen) = p.next_load(&m).unwrap();
        drop(p);
        assert!(!m.finish_load(s as usize, gen, None));
    }

    #[test]
    fn budget_evicts_the_least_recently_used_region_never_one_loading() {
        let m = lu(HpbControl::Host);
        // Regions 0 and 1 (sub-regions 0..4) fill the 4 slots.
        for s in 0..4 {
            assert!(load(&m, s, 100 * s as u64));
            m.clock.fetch_add(1, Ordering::Relaxed);
        }
        // Region 1 used more recently than region 0.
        let _ = m.lookup(0, 1);
        m.clock.fetch_add(5, Ordering::Relaxed);
        let _ = m.lookup(2 * 16, 1);
        assert!(load(&m, 4, 400), "evicts region 0");
        let s = m.stats();
        assert_eq!(s.evictions, 1);
        assert!(s.host_map_bytes <= s.memory_budget);
        assert!(matches!(m.lookup(0, 1), Lookup::Miss(_)));
        assert!(matches!(m.lookup(2 * 16, 1), Lookup::Hit(200)));
        // Evictions queue a WRITE BUFFER in host control.
        assert_eq!(m.policy().next_inactivation(), Some(0));
        // Fill the budget again; region 1 is now the least recently used
        // but has a load in flight: region 2 goes instead.
        assert!(load(&m, 5, 500));
        m.clock.fetch_add(1, Ordering::Relaxed);
        let _ = m.lookup(4 * 16, 1);
        let mut p = m.policy();
        m.dirty(3 * 16, 1);
        p.reload(&m, 3);
        assert_eq!(p.next_load(&m).map(|x| x.0), Some(3));
        m.reads[6].store(9, Ordering::Relaxed);
        p.candidate(&m, 6);
        drop(p);
        assert!(m.words[6].load(Ordering::Relaxed) & ACTIVE != 0);
        assert!(m.words[3].load(Ordering::Relaxed) & (ACTIVE | LOADING) == ACTIVE | LOADING);
        assert_eq!(
            m.words[4].load(Ordering::Relaxed) & ACTIVE,
            0,
            "region 2 evicted"
        );
        assert_eq!(m.stats().evictions, 2);
        assert!(m.stats().host_map_bytes_peak <= m.cfg.memory_budget);
    }

    #[test]
    fn hostile_recommendations_are_refused_not_trusted() {
        let m = lu(HpbControl::Device);
        let mut p = m.policy();
        assert!(!p.rec_active(&m, 4, 0), "region past the LU");
        assert!(!p.rec_active(&m, 0, 2), "sub-region past its region");
        assert!(!p.rec_active(&m, u16::MAX, u16::MAX));
        assert!(!p.rec_inactive(&m, 9));
        assert!(p.rec_active(&m, 3, 1));
        assert_eq!(p.next_load(&m).map(|x| x.0), Some(7));
        // Host control follows no activation it did not make.
        let h = lu(HpbControl::Host);
        let mut q = h.policy();
        assert!(q.rec_active(&h, 1, 0));
        assert!(q.next_load(&h).is_none());
    }

    #[test]
    fn map_reset_notice_invalidates_and_reloads_everything_held() {
        let m = lu(HpbControl::Device);
        assert!(load(&m, 2, 0));
        assert!(load(&m, 5, 0));
        let mut p = m.policy();
        p.rec_reset(&m);
        assert!(matches!(m.lookup(2 * 16, 1), Lookup::Miss(_)));
        let mut again = Vec::new();
        while let Some((s, _)) = p.next_load(&m) {
            again.push(s);
        }
        again.sort_unstable();
        assert_eq!(again, vec![2, 5]);
    }

    #[test]
    fn readers_never_see_an_entry_of_another_generation() {
        // One thread dirties sub-region 0, scribbles over its slot, and
        // publishes fresh entries, over and over; readers check every hit.
        let m = std::sync::Arc::new(lu(HpbControl::Device));
        assert!(load(&m, 0, 0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (m, stop) = (m.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut hits = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if let Lookup::Hit(e) = m.lookup(5, 1) {
                            // Published entries are `base + i` with base a
                            // multiple of 1000; the scribble is all ones.
                            assert_eq!(e % 1000, 5, "entry {e:#x} read while not valid");
                            hits += 1;
                        }
                    }
                    hits
                })
            })
            .collect();
        let slot = slot_of(m.words[0].load(Ordering::Relaxed)) as usize;
        for round in 1..2000u64 {
            m.dirty(0, 1);
            // While not valid, the slot may hold anything (a reused slot,
            // a load in progress): readers must never return it.
            for e in m.slab[slot].get().unwrap().iter() {
                e.store(u64::MAX, Ordering::Relaxed);
            }
            let mut p = m.policy();
            p.reload(&m, 0);
            let (s, gen) = p.next_load(&m).unwrap();
            drop(p);
            assert!(m.finish_load(s as usize, gen, Some(&entries(round * 1000))));
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
    }
}
