//! # Host Performance Booster (HPB): the host's copy of the device's L2P map
//!
//! A UFS device keeps only part of its logical-to-physical map in its own
//! DRAM; a random read outside it costs an extra NAND read. With HPB the
//! host keeps 8-byte L2P entries of the regions it reads (loaded with HPB
//! READ BUFFER) and sends the first block's entry inside the read (HPB
//! READ), so the device can skip its lookup. A device may check the entry
//! and fall back to its own lookup when it is stale (the fake does, unless
//! told to trust entries), or may use it as it is: so the host never sends
//! an entry older than a write that completed before the read was
//! submitted (see below).
//!
//! Enabled per LU at bring-up with [`HpbConfig`] in
//! [`UfsOptions::hpb`](super::UfsOptions::hpb): the controller reads the
//! HPB fields of the device, geometry and unit descriptors and
//! bMAX_DATA_SIZE_FOR_HPB_SINGLE_CMD, sets fHPBReset (and waits for the
//! device to clear it) and fHPBEn. Both control modes:
//!
//! - **device control** (bHPBControl = 1): the device recommends in any
//!   RESPONSE UPIU which (region, sub-region) to load and which regions to
//!   drop; the host follows, within its memory budget (LRU of regions);
//! - **host control** (bHPBControl = 0): the host counts reads per
//!   sub-region; one that reaches [`HpbConfig::activation_threshold`] is
//!   activated and loaded. When the budget (or the device's active-region
//!   limit) is full, the least recently used region with at most
//!   [`HpbConfig::eviction_exit`] reads is evicted, if the incoming region
//!   has at least [`HpbConfig::eviction_enter`]; the host tells the device
//!   with HPB WRITE BUFFER. Every [`HpbConfig::normalize_interval`] reads
//!   the counters are divided by `2^normalization_factor` and active regions
//!   left with no reads are evicted. The device's update recommendations for
//!   active sub-regions are followed, its inactivations ignored.
//!
//! In both modes pinned regions (wHPBPinnedRegionStartIdx,
//! wNumHPBPinnedRegions) are loaded first and never evicted, a map-reset
//! notice (`hpb_op` 2) reloads everything, and a device report that it fell
//! back on an entry (counted in [`HpbStats::stale_fallbacks`]) reloads that
//! sub-region.
//!
//! ## On the I/O path
//!
//! - A read of at most the single-command limit (bMAX_DATA_SIZE_FOR_HPB_SINGLE_CMD)
//!   whose sub-regions are all valid goes out as HPB READ with the first
//!   block's entry; any other read as a normal READ.
//! - A write or unmap dirties every sub-region it touches **before** it is
//!   posted, and again **when it ends** (completion, error, reset,
//!   withdrawal — before the application hears of it). The first stops
//!   reads and in-flight loads from using older entries; the second stops
//!   a map load that was issued after the write's submission but run by
//!   the device before the write (same generation, pre-write entries) from
//!   being used once the write completed. So a read submitted after a
//!   write's completion never carries an entry older than that write.
//!   Exception: a write the queue pair had to give up without the device
//!   confirming it (a controller that cannot be disabled) may still
//!   execute later, and so change data under any entry (or none).
//! - Map loads (READ BUFFER) and inactivations (WRITE BUFFER) are internal
//!   commands on the same queue pairs: posted from `poll`, at most
//!   [`HpbConfig::inflight_map_loads`] per queue pair and never into a full
//!   queue; their completions are consumed by the queue pair, never handed
//!   to the application, in every path (completion, timeout, withdrawal,
//!   failed or successful reset, close, drop). Their data lands in DMA
//!   buffers the queue pair owns (leaked with the queue's memory if the
//!   device may still write them).
//! - Internal commands are stamped with their own submission time and are
//!   not the application's for timeouts: the application's
//!   [`TimeoutPolicy`](crate::TimeoutPolicy), `check_timeouts`, `abort` and
//!   [`UfsQpairStats`](crate::ufs::UfsQpairStats) never see them. One still
//!   in flight after the queue pair's `io_timeout` is withdrawn (MCQ
//!   cleanup by nexus, UTRLCLR) and ends as a failed load (loaded again when
//!   needed); if the controller refuses, or does not give it back within
//!   another timeout, it is given up: its slot is retired until a
//!   controller reset and its buffer never reused. Never a controller
//!   reset; counted in [`HpbStats::internal_timeouts`] and
//!   [`HpbStats::internal_given_up`]. Without an `io_timeout` they wait
//!   like the application's commands (until close, which withdraws them).
//!
//! ## Concurrency: lock-free readers over a per-sub-region seqlock
//!
//! The map of an LU is shared by every queue pair (threads). Each
//! sub-region has one atomic state word: `generation:32 | slot:24 |
//! flags:8`, flags ACTIVE (owns an entry slot), VALID (entries current as
//! of this generation), LOADING (a READ BUFFER in flight; its slot may not
//! be freed).
//!
//! - **Reader** (submit of a read): load the word (Acquire); if ACTIVE and
//!   VALID, load the entry from the slot (Relaxed), an Acquire fence, load
//!   the word again: equal means no writer dirtied, evicted or reloaded the
//!   sub-region in between, so the entry is the one published for that
//!   generation. No lock, no store but a lossy read counter and an LRU stamp
//!   that is written only when it changes.
//! - **Dirty** (submit of a write/unmap): compare-and-swap the word to
//!   `!VALID` with the next generation (kept ACTIVE and LOADING).
//! - **Load completion**: store the entries into the slot (Relaxed), then
//!   compare-and-swap the word (Release) to VALID without LOADING **only if
//!   the generation is the one the load was issued at**; otherwise clear
//!   LOADING and load again.
//! - **Policy** (activation, eviction, slot reuse, choosing loads): under
//!   the LU's mutex, which queue pairs take only with `try_lock` from their
//!   poll (if another thread holds it, this one tries at its next poll).
//!   Eviction bumps the generation and frees the slot only when no load of
//!   the region is in flight, so a slot is never rewritten while a
//!   reader's re-check could still pass.
//!
//! Entry slots are allocated on first use, up to
//! [`HpbConfig::memory_budget`] bytes of entries per LU, and reused after
//! evictions: [`HpbStats::host_map_bytes`] never exceeds the budget.

mod map;
mod policy;
pub(crate) mod qp;

use std::sync::Arc;

pub(crate) use map::LuMap;

use super::ctrl::LogicalUnit;
use super::error::{UfsCtrlError, UfsResult};
use super::spec::{be16, be32};

/// Flag fHPBReset.
pub const FLAG_HPB_RESET: u8 = 0x11;
/// Flag fHPBEn.
pub const FLAG_HPB_EN: u8 = 0x12;
/// Attribute bMAX_DATA_SIZE_FOR_HPB_SINGLE_CMD.
pub const ATTR_MAX_HPB_SINGLE_CMD: u8 = 0x01;
/// RESPONSE UPIU device-information bit: HPB update alert.
pub const DEV_INFO_UPDATE_ALERT: u8 = 0x02;
/// RESPONSE UPIU device-information bit (vendor, the fake device's): the
/// device rejected this HPB READ's entry and used its own lookup.
pub const DEV_INFO_HPB_FALLBACK: u8 = 0x04;
/// `hpb_op`: region recommendations follow.
pub const HPB_OP_REGION_UPDATE: u8 = 1;
/// `hpb_op`: the device reset its map.
pub const HPB_OP_DEV_RESET: u8 = 2;

/// Descriptor offsets of the HPB fields.
mod off {
    pub const DEV_HPB_VERSION: usize = 0x40;
    pub const DEV_HPB_CONTROL: usize = 0x42;
    pub const DEV_EXT_FEATURES: usize = 0x4F;
    pub const EXT_FEATURE_HPB: u32 = 1 << 7;
    pub const GEO_REGION_SIZE: usize = 0x48;
    pub const GEO_SUBREGION_SIZE: usize = 0x4A;
    pub const UNIT_LU_ENABLE: usize = 0x03;
    pub const UNIT_MAX_ACTIVE: usize = 0x23;
    pub const UNIT_PINNED_START: usize = 0x25;
    pub const UNIT_PINNED_COUNT: usize = 0x27;
    pub const LU_ENABLE_HPB: u8 = 0x02;
}

/// Who decides which regions are active (the device's bHPBControl).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HpbControl {
    /// Host control (bHPBControl = 0).
    Host,
    /// Device control (bHPBControl = 1).
    Device,
}

/// Which control mode the host accepts.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum HpbMode {
    /// Whatever the device uses.
    #[default]
    Auto,
    /// Only device control (bring-up fails on a host-control device).
    Device,
    /// Only host control (bring-up fails on a device-control device).
    Host,
}

/// HPB settings, for every HPB LU in `lu_mask`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HpbConfig {
    /// The control mode to accept.
    pub mode: HpbMode,
    /// LUs to enable HPB on (bit n = LUN n) among the device's HPB LUs.
    pub lu_mask: u32,
    /// Bytes of 8-byte entries the host may hold per LU (Linux's
    /// `ufshpb_host_map_kbytes`: 2 MiB covers 1 GiB).
    pub memory_budget: u64,
    /// Host control: reads of a sub-region before it is loaded.
    pub activation_threshold: u32,
    /// Host control: counters are shifted right by this much at each
    /// normalisation.
    pub normalization_factor: u32,
    /// Host control: reads per LU between normalisations (0 = never).
    pub normalize_interval: u64,
    /// Host control: an incoming region needs at least this many reads to
    /// evict another.
    pub eviction_enter: u32,
    /// Host control: a region with more reads than this is not evicted.
    pub eviction_exit: u32,
    /// READ BUFFERs a queue pair keeps in flight at most (≥ 1).
    pub inflight_map_loads: u32,
    /// Bring-up fails if the device has no HPB (else HPB is just off).
    pub required: bool,
}

impl Default for HpbConfig {
    fn default() -> Self {
        HpbConfig {
            mode: HpbMode::Auto,
            lu_mask: u32::MAX,
            memory_budget: 2 << 20,
            activation_threshold: 8,
            normalization_factor: 1,
            normalize_interval: 1 << 20,
            eviction_enter: 256,
            eviction_exit: 128,
            inflight_map_loads: 2,
            required: false,
        }
    }
}

/// Counters and sizes of one HPB LU (all queue pairs together; a queue
/// pair adds its share at each of its policy passes and when it is
/// dropped).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct HpbStats {
    /// The LU.
    pub lun: u8,
    /// Host control (else device control).
    pub host_control: bool,
    /// Reads sent as HPB READ.
    pub hpb_reads: u64,
    /// Reads of this LU sent as normal READ.
    pub normal_reads: u64,
    /// READ BUFFERs completed and published.
    pub map_loads: u64,
    /// READ BUFFERs that failed.
    pub map_load_errors: u64,
    /// READ BUFFERs completed after a write dirtied their sub-region (not
    /// published; loaded again).
    pub map_loads_discarded: u64,
    /// Internal commands (map loads, inactivations) still in flight after
    /// the queue pair's I/O timeout: withdrawn by the queue pair itself
    /// (never counted in [`UfsQpairStats`](crate::ufs::UfsQpairStats),
    /// never a controller reset).
    pub internal_timeouts: u64,
    /// Of those, the ones the controller would not give up: ended inside
    /// the queue pair with their slot retired (until a controller reset)
    /// and their buffer never reused.
    pub internal_given_up: u64,
    /// HPB READs whose entry the device rejected and served with its own
    /// lookup (the device's report).
    pub stale_fallbacks: u64,
    /// Regions the host dropped (budget, limit, device recommendation,
    /// normalisation).
    pub evictions: u64,
    /// HPB WRITE BUFFER inactivations sent (host control).
    pub inactivations_sent: u64,
    /// (region, sub-region) load recommendations received.
    pub active_recs: u64,
    /// Region inactivation recommendations received.
    pub inactive_recs: u64,
    /// Map-reset notices received.
    pub reset_notices: u64,
    /// Recommendations naming regions the LU does not have (ignored).
    pub bad_recs: u64,
    /// Sub-regions dirtied by writes and unmaps.
    pub dirtied: u64,
    /// Normalisations of the read counters.
    pub normalizations: u64,
    /// Entry memory allocated (never above `memory_budget`).
    pub host_map_bytes: u64,
    /// Entry memory held by active sub-regions now.
    pub host_map_bytes_used: u64,
    /// Most entry memory held at once.
    pub host_map_bytes_peak: u64,
    /// Per-sub-region state words, counters and slot table.
    pub host_meta_bytes: u64,
    /// The budget.
    pub memory_budget: u64,
    /// Sub-regions whose entries are valid now.
    pub valid_subregions: u64,
    /// Regions active on the host now.
    pub active_regions: u64,
}

/// A device-management request the HPB bring-up needs.
pub(crate) enum Query {
    ReadAttr(u8),
    SetFlag(u8),
    ReadFlag(u8),
}

fn bad(what: &'static str, value: u64, why: &'static str) -> UfsCtrlError {
    UfsCtrlError::BadValue { what, value, why }
}

/// Reset the device's HPB state (fHPBReset, until the device clears it),
/// then set fHPBEn.
fn device_enable(query: &mut dyn FnMut(Query) -> UfsResult<u32>) -> UfsResult<()> {
    query(Query::SetFlag(FLAG_HPB_RESET))?;
    let mut cleared = false;
    for _ in 0..1000 {
        if query(Query::ReadFlag(FLAG_HPB_RESET))? == 0 {
            cleared = true;
            break;
        }
        std::thread::yield_now();
    }
    if !cleared {
        return Err(UfsCtrlError::Timeout {
            what: "clear fHPBReset",
            timeout_ms: 0,
        });
    }
    query(Query::SetFlag(FLAG_HPB_EN))?;
    Ok(())
}

/// After a host controller reset: the device's HPB state is gone. Enable
/// HPB again and treat it as the device's reset-of-map notice on every LU
/// (every active sub-region is dirtied and queued for a reload).
pub(crate) fn after_reset(
    maps: &[Option<Arc<LuMap>>],
    query: &mut dyn FnMut(Query) -> UfsResult<u32>,
) -> UfsResult<()> {
    device_enable(query)?;
    for m in maps.iter().flatten() {
        m.policy().rec_reset(m);
    }
    Ok(())
}

/// Enable HPB on the LUs `cfg` selects: read the HPB descriptor fields,
/// reset the device's HPB state, set fHPBEn and build each LU's map.
/// `units` holds the raw unit descriptor of each LU in `lus`. Returns the
/// maps indexed by LUN (empty when the device has no HPB and it is not
/// required).
pub(crate) fn enable(
    cfg: &HpbConfig,
    dev: &[u8],
    geo: &[u8],
    units: &[(u8, Vec<u8>)],
    lus: &[LogicalUnit],
    query: &mut dyn FnMut(Query) -> UfsResult<u32>,
) -> UfsResult<Vec<Option<Arc<LuMap>>>> {
    let has = dev.len() >= off::DEV_EXT_FEATURES + 4
        && be32(dev, off::DEV_EXT_FEATURES) & off::EXT_FEATURE_HPB != 0
        && geo.len() > off::GEO_SUBREGION_SIZE;
    if !has {
        if cfg.required {
            return Err(UfsCtrlError::InvalidOption(
                "HPB required, but the device does not support it (dExtendedUFSFeaturesSupport bit 7)"
                    .into(),
            ));
        }
        return Ok(Vec::new());
    }
    let version = be16(dev, off::DEV_HPB_VERSION);
    let control = match dev[off::DEV_HPB_CONTROL] {
        0 => HpbControl::Host,
        1 => HpbControl::Device,
        v => {
            return Err(bad(
                "bHPBControl",
                u64::from(v),
                "neither 0 (host) nor 1 (device)",
            ))
        }
    };
    match (cfg.mode, control) {
        (HpbMode::Device, HpbControl::Host) | (HpbMode::Host, HpbControl::Device) => {
            return Err(UfsCtrlError::InvalidOption(format!(
                "HPB mode {:?} asked for, the device uses {control:?} control",
                cfg.mode
            )))
        }
        _ => {}
    }
    if control == HpbControl::Host && version < 0x0200 {
        return Err(bad(
            "wHPBVersion",
            u64::from(version),
            "host control needs HPB 2.0",
        ));
    }
    let rs = geo[off::GEO_REGION_SIZE];
    let ss = geo[off::GEO_SUBREGION_SIZE];
    // Region and sub-region of at least one 4 KiB entry, sub-region within
    // region, at most 2^16 sub-regions per region; a sub-region's entries
    // must fit one PRDT entry (256 KiB: a 128 MiB sub-region).
    if !(3..=18).contains(&ss) || ss > rs || rs - ss > 16 {
        return Err(bad(
            "bHPBRegionSize / bHPBSubRegionSize",
            u64::from(rs) << 8 | u64::from(ss),
            "need 4 KiB <= sub-region <= region <= 2^16 sub-regions, sub-region <= 128 MiB",
        ));
    }
    if cfg.inflight_map_loads == 0 {
        return Err(UfsCtrlError::InvalidOption(
            "HPB inflight_map_loads must be at least 1".into(),
        ));
    }
    let single = if version < 0x0200 {
        1
    } else {
        let v = query(Query::ReadAttr(ATTR_MAX_HPB_SINGLE_CMD))?;
        (v.min(0xFF) + 1).min(255)
    };
    let mut picked = Vec::new();
    for l in lus {
        let Some((_, u)) = units.iter().find(|(n, _)| *n == l.lun) else {
            continue;
        };
        if u.len() < off::UNIT_PINNED_COUNT + 2
            || u[off::UNIT_LU_ENABLE] != off::LU_ENABLE_HPB
            || l.lun >= 32
            || cfg.lu_mask >> l.lun & 1 == 0
            || l.block_len != 4096
        {
            continue;
        }
        picked.push((l, u));
    }
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    device_enable(query)?;
    let mut maps = Vec::new();
    for (l, u) in picked {
        let max_active = u32::from(be16(u, off::UNIT_MAX_ACTIVE));
        let p0 = u32::from(be16(u, off::UNIT_PINNED_START));
        let pn = u32::from(be16(u, off::UNIT_PINNED_COUNT));
        let srgn_shift = u32::from(ss) - 3;
        let per_rgn_shift = u32::from(rs - ss);
        // What the host maps: HPB READ carries a 32-bit LBA, READ BUFFER a
        // 16-bit region; and at most 2^22 sub-regions (their state words).
        let cover = l
            .blocks
            .min(1 << 32)
            .min((1u64 << 22) << srgn_shift)
            .min((1u64 << 16) << (srgn_shift + per_rgn_shift));
        let m = LuMap::new(
            l.lun,
            control,
            cover,
            srgn_shift,
            per_rgn_shift,
            single,
            max_active,
            p0..p0.saturating_add(pn),
            cfg.clone(),
        );
        let i = usize::from(l.lun);
        if maps.len() <= i {
            maps.resize(i + 1, None);
        }
        maps[i] = Some(Arc::new(m));
    }
    Ok(maps)
}

impl super::UfsController {
    /// Test knob, not an API: make the host map of LU `lun` hold `f(old)`
    /// as the entry of `lba` (as a broken host would), so the next HPB READ
    /// of `lba` sends it and the device's check can be seen to catch it.
    /// Returns the entry held before, or `None` if `lba`'s sub-region has
    /// no valid entries.
    #[doc(hidden)]
    pub fn hpb_swap_entry_for_test(
        &self,
        lun: u8,
        lba: u64,
        f: impl FnOnce(u64) -> u64,
    ) -> Option<u64> {
        self.hpb_maps()
            .get(usize::from(lun))?
            .as_ref()?
            .swap_entry(lba, f)
    }
}
