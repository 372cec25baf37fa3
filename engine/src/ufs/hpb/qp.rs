//! A queue pair's side of HPB: the read and write hooks of its submit path,
//! its internal commands (map loads, inactivations) with their DMA
//! buffers, the notices its completions carry, and its policy passes.
//! Owned by one [`UfsQueuePair`](crate::ufs::UfsQueuePair), so nothing here
//! is shared but the [`LuMap`]s.

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mcqio_vfio::{DmaDir, DmaSpace};

use super::map::{Lookup, LuMap};
use super::{DEV_INFO_HPB_FALLBACK, DEV_INFO_UPDATE_ALERT, HPB_OP_DEV_RESET, HPB_OP_REGION_UPDATE};
use crate::core::io::DmaBuf;
use crate::ufs::spec::scsi::{self, Cdb};
use crate::ufs::spec::upiu::ResponseUpiu;

/// Device-information bits the completion path hands to [`HpbQp::note`].
pub(crate) const DEV_INFO_HPB: u8 = DEV_INFO_UPDATE_ALERT | DEV_INFO_HPB_FALLBACK;
/// Polls between policy passes when nothing local is pending (to pick up
/// loads other queue pairs queued).
const PASS_EVERY: u32 = 16;
/// Bound of each local work list (entries beyond are dropped; a read
/// counter or the device will raise them again).
const LOCAL_CAP: usize = 256;

/// An internal command in flight in a tracker slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Internal {
    None,
    /// READ BUFFER of sub-region `s` of map `map`, issued at `gen`, into
    /// buffer `buf`.
    Load {
        map: u8,
        s: u32,
        gen: u32,
        buf: u16,
    },
    /// WRITE BUFFER inactivation of region `rgn` on map `map`.
    Inactivate {
        map: u8,
        rgn: u16,
    },
}

/// Where an internal command stands with its timeout (see
/// [`HpbQp::timeout_step`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Watch {
    /// Not past its timeout.
    None,
    /// Withdrawn at this time (ms): its ABORTED completion is due.
    Withdrawn(u32),
    /// The withdrawal was refused at this time (ms): given up unless it
    /// completes soon.
    Refused(u32),
}

/// What the queue pair does about an internal command past its time.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Overdue {
    /// Ask the controller to give it up (MCQ cleanup, UTRLCLR).
    Withdraw,
    /// Give it up: retire its slot ([`HpbQp::give_up`]).
    GiveUp,
}

/// An internal command for the queue pair to post.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Cmd {
    /// LUN.
    pub lun: u8,
    /// The CDB.
    pub cdb: Cdb,
    /// Data-in buffer: (IOVA, bytes).
    pub data: Option<(u64, u32)>,
    kind: Internal,
}

/// Counts a queue pair gathers between policy passes, per map.
#[derive(Copy, Clone, Default)]
struct Local {
    hpb_reads: u64,
    normal_reads: u64,
}

/// The HPB state of one queue pair.
pub(crate) struct HpbQp {
    on: bool,
    /// By LUN: index into `maps`.
    by_lun: Vec<u8>,
    maps: Vec<Arc<LuMap>>,
    local: Vec<Local>,
    /// Per tracker slot.
    internal: Vec<Internal>,
    /// Per tracker slot: (map, LBA) of the HPB READ in it.
    hpb_lba: Vec<(u8, u64)>,
    /// Per tracker slot: (map, blocks, LBA) of the write or unmap in it
    /// (blocks 0: none), dirtied again when it ends.
    writes: Vec<(u8, u32, u64)>,
    /// Per tracker slot: the timeout state of the internal command in it.
    watch: Vec<Watch>,
    bufs: ManuallyDrop<Option<DmaBuf>>,
    buf_len: usize,
    buf_free: Vec<u16>,
    inflight: usize,
    max_inflight: usize,
    /// Host control: (map, sub-region) made hot by a read.
    cands: Vec<(u8, u32)>,
    /// HPB blocks of RESPONSE UPIUs: (LUN, bytes 32..52).
    recs: Vec<(u8, [u8; 20])>,
    /// (map, sub-region) to load again.
    reloads: Vec<(u8, u32)>,
    /// (map, sub-region) the device fell back on.
    fallbacks: Vec<(u8, u32)>,
    /// (map, region) whose WRITE BUFFER ended.
    wb_done: Vec<(u8, u16)>,
    dropped_recs: u64,
    polls: u32,
    out: Vec<Cmd>,
    scratch: Vec<u8>,
    leak: bool,
}

const NO_MAP: u8 = u8::MAX;

impl HpbQp {
    /// The HPB side of a queue pair of `depth` slots over the controller's
    /// maps (by LUN); allocates its map-load buffers from `space`.
    pub(crate) fn new(
        maps_by_lun: &[Option<Arc<LuMap>>],
        space: &Arc<DmaSpace>,
        depth: usize,
    ) -> crate::core::error::Result<Self> {
        let mut by_lun = Vec::new();
        let mut maps = Vec::new();
        for (lun, m) in maps_by_lun.iter().enumerate() {
            if let Some(m) = m {
                if by_lun.len() <= lun {
                    by_lun.resize(lun + 1, NO_MAP);
                }
                by_lun[lun] = maps.len() as u8;
                maps.push(Arc::clone(m));
            }
        }
        let on = !maps.is_empty();
        let max_inflight = maps
            .iter()
            .map(|m| m.cfg.inflight_map_loads as usize)
            .max()
            .unwrap_or(0)
            .clamp(usize::from(on), depth.saturating_sub(1).max(1));
        let buf_len = maps
            .iter()
            .map(|m| (8usize << m.srgn_shift).max(4))
            .max()
            .unwrap_or(0);
        let bufs = if on {
            Some(DmaBuf::alloc(
                space,
                max_inflight * buf_len,
                DmaDir::Bidirectional,
            )?)
        } else {
            None
        };
        Ok(HpbQp {
            on,
            by_lun,
            local: vec![Local::default(); maps.len()],
            maps,
            internal: if on {
                vec![Internal::None; depth]
            } else {
                Vec::new()
            },
            hpb_lba: if on { vec![(0, 0); depth] } else { Vec::new() },
            writes: if on {
                vec![(0, 0, 0); depth]
            } else {
                Vec::new()
            },
            watch: if on {
                vec![Watch::None; depth]
            } else {
                Vec::new()
            },
            bufs: ManuallyDrop::new(bufs),
            buf_len,
            buf_free: (0..max_inflight as u16).rev().collect(),
            inflight: 0,
            max_inflight,
            cands: Vec::with_capacity(if on { LOCAL_CAP } else { 0 }),
            recs: Vec::with_capacity(if on { LOCAL_CAP } else { 0 }),
            reloads: Vec::with_capacity(if on { LOCAL_CAP } else { 0 }),
            fallbacks: Vec::with_capacity(if on { LOCAL_CAP } else { 0 }),
            wb_done: Vec::with_capacity(if on { depth } else { 0 }),
            dropped_recs: 0,
            polls: 0,
            out: Vec::with_capacity(if on { max_inflight + LOCAL_CAP } else { 0 }),
            scratch: vec![0; buf_len],
            leak: false,
        })
    }

    #[inline(always)]
    fn map_of(&self, lun: u8) -> Option<u8> {
        match self.by_lun.get(usize::from(lun)) {
            Some(&i) if i != NO_MAP => Some(i),
            _ => None,
        }
    }

    /// Internal commands in flight (not the application's).
    #[inline(always)]
    pub(crate) fn inflight(&self) -> usize {
        self.inflight
    }

    /// The CDB of a read of `blocks` at `lba` of `lun` going into tracker
    /// `slot`: HPB READ when the map has a current entry, else `None`
    /// (normal READ).
    #[inline]
    pub(crate) fn read_cdb(&mut self, slot: u16, lun: u8, lba: u64, blocks: u32) -> Option<Cdb> {
        if !self.on {
            return None;
        }
        let mi = self.map_of(lun)?;
        let m = &self.maps[usize::from(mi)];
        match m.lookup(lba, blocks) {
            Lookup::Hit(e) => {
                self.local[usize::from(mi)].hpb_reads += 1;
                self.hpb_lba[usize::from(slot)] = (mi, lba);
                // `lookup` checked lba <= u32::MAX and blocks <= 255.
                Some(scsi::hpb_read(lba as u32, e, blocks as u8))
            }
            Lookup::Miss(hot) => {
                self.local[usize::from(mi)].normal_reads += 1;
                if hot && self.cands.len() < LOCAL_CAP {
                    self.cands.push((mi, (lba >> m.srgn_shift) as u32));
                }
                None
            }
        }
    }

    /// A write or unmap of `[lba, lba + blocks)` of `lun` is about to be
    /// posted.
    #[inline]
    pub(crate) fn dirty(&self, lun: u8, lba: u64, blocks: u32) {
        if !self.on {
            return;
        }
        if let Some(mi) = self.map_of(lun) {
            self.maps[usize::from(mi)].dirty(lba, blocks);
        }
    }

    /// Whether HPB is on for this queue pair.
    #[inline(always)]
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// A write of `[lba, lba + blocks)` of `lun` goes into tracker `slot`
    /// and is about to be posted: [`Self::dirty`] now and
    /// [`Self::note_write`] for its end.
    #[inline]
    pub(crate) fn dirty_write(&mut self, slot: u16, lun: u8, lba: u64, blocks: u32) {
        if !self.on {
            return;
        }
        if let Some(mi) = self.map_of(lun) {
            self.maps[usize::from(mi)].dirty(lba, blocks);
            self.writes[usize::from(slot)] = (mi, blocks, lba);
        }
    }

    /// The write or unmap of `[lba, lba + blocks)` of `lun` in tracker
    /// `slot` was posted (after [`Self::dirty`]): when it ends, its
    /// sub-regions are dirtied again ([`Self::write_ended`]).
    #[inline]
    pub(crate) fn note_write(&mut self, slot: u16, lun: u8, lba: u64, blocks: u32) {
        if !self.on {
            return;
        }
        if let Some(mi) = self.map_of(lun) {
            self.writes[usize::from(slot)] = (mi, blocks, lba);
        }
    }

    /// The application command in `slot` ended (any way: completion, reset,
    /// failure, withdrawal, given up), before the application hears of it.
    /// A write or unmap dirties its sub-regions again: a map load the
    /// device ran before the write, but that completed after the write's
    /// submission dirtied them (same generation), is then not used by any
    /// read submitted after the write's end.
    #[inline(always)]
    pub(crate) fn write_ended(&mut self, slot: u16) {
        if !self.on {
            return;
        }
        self.write_ended_cold(slot);
    }

    #[inline]
    fn write_ended_cold(&mut self, slot: u16) {
        let Some(w) = self.writes.get_mut(usize::from(slot)) else {
            return;
        };
        let (mi, blocks, lba) = std::mem::take(w);
        if blocks != 0 {
            if let Some(m) = self.maps.get(usize::from(mi)) {
                m.dirty(lba, blocks);
            }
        }
    }

    /// Every command in flight is ending at once (reset, failure, close):
    /// [`Self::write_ended`] for each write among them.
    #[cold]
    pub(crate) fn all_writes_ended(&mut self) {
        if !self.on {
            return;
        }
        for slot in 0..self.writes.len() {
            self.write_ended_cold(slot as u16);
        }
    }

    /// Whether `slot` holds an internal command.
    #[inline(always)]
    pub(crate) fn is_internal(&self, slot: u16) -> bool {
        self.on && self.internal[usize::from(slot)] != Internal::None
    }

    /// A GOOD response carried HPB device information `dev_info` (alert or
    /// fallback) for the command in `slot`.
    #[cold]
    pub(crate) fn note(&mut self, slot: u16, dev_info: u8, rsp: &ResponseUpiu) {
        if !self.on {
            return;
        }
        if dev_info & DEV_INFO_HPB_FALLBACK != 0 {
            let (mi, lba) = self.hpb_lba[usize::from(slot)];
            if let Some(m) = self.maps.get(usize::from(mi)) {
                m.c.stale_fallbacks.fetch_add(1, Ordering::Relaxed);
                if self.fallbacks.len() < LOCAL_CAP {
                    self.fallbacks.push((mi, (lba >> m.srgn_shift) as u32));
                }
            }
        }
        if dev_info & DEV_INFO_UPDATE_ALERT != 0 {
            let mut b = [0u8; 20];
            b[..2].copy_from_slice(&rsp.sense_len);
            b[2..].copy_from_slice(&rsp.sense);
            let lun = b[5];
            if self.recs.len() < LOCAL_CAP {
                self.recs.push((lun, b));
            } else {
                self.dropped_recs += 1;
            }
        }
    }

    /// The internal command in `slot` completed (`ok`: GOOD). The tracker
    /// slot is already free.
    #[cold]
    pub(crate) fn complete(&mut self, slot: u16, ok: bool) {
        let Some(k) = self.take(slot) else {
            return;
        };
        match k {
            Internal::Load { map, s, gen, buf } => {
                let m = Arc::clone(&self.maps[usize::from(map)]);
                let len = (m.srgn_len(s as usize) * 8) as usize;
                let data = if ok {
                    match self.bufs.as_ref().map(|b| {
                        b.read_at(usize::from(buf) * self.buf_len, &mut self.scratch[..len])
                    }) {
                        Some(Ok(())) => Some(&self.scratch[..len]),
                        _ => None,
                    }
                } else {
                    None
                };
                let published = m.finish_load(s as usize, gen, data);
                self.buf_free.push(buf);
                if published {
                    m.c.map_loads.fetch_add(1, Ordering::Relaxed);
                } else {
                    if ok {
                        m.c.map_loads_discarded.fetch_add(1, Ordering::Relaxed);
                    } else {
                        m.c.map_load_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if self.reloads.len() < LOCAL_CAP && ok {
                        self.reloads.push((map, s));
                    }
                }
            }
            Internal::Inactivate { map, rgn } => {
                if let Some(m) = self.maps.get(usize::from(map)) {
                    m.c.inactivations_sent.fetch_add(1, Ordering::Relaxed);
                }
                // At most one per slot: the capacity (depth) suffices.
                self.wb_done.push((map, rgn));
            }
            Internal::None => {}
        }
    }

    /// Clear `slot`'s internal mark and timeout state: the command in it
    /// ends now. `None` if it held none.
    fn take(&mut self, slot: u16) -> Option<Internal> {
        let k = std::mem::replace(self.internal.get_mut(usize::from(slot))?, Internal::None);
        if k == Internal::None {
            return None;
        }
        self.watch[usize::from(slot)] = Watch::None;
        self.inflight = self.inflight.saturating_sub(1);
        Some(k)
    }

    /// The internal command in `slot`, submitted at `submitted_ms`: what to
    /// do about it at `now_ms` with a timeout of `limit_ms` (`scan_ms`:
    /// the scan interval). Never the application's policy: an internal
    /// command is withdrawn once, and given up (never a controller reset)
    /// if the controller refuses, or does not give it back within another
    /// timeout.
    pub(crate) fn timeout_step(
        &self,
        slot: u16,
        submitted_ms: u32,
        now_ms: u32,
        limit_ms: u32,
        scan_ms: u32,
    ) -> Option<Overdue> {
        if !self.is_internal(slot) {
            return None;
        }
        match self.watch[usize::from(slot)] {
            Watch::None if now_ms.wrapping_sub(submitted_ms) >= limit_ms => Some(Overdue::Withdraw),
            Watch::Withdrawn(t) if now_ms.wrapping_sub(t) >= limit_ms => Some(Overdue::GiveUp),
            // Refused: it may have completed meanwhile; give it a scan.
            Watch::Refused(t) if now_ms.wrapping_sub(t) >= scan_ms => Some(Overdue::GiveUp),
            _ => None,
        }
    }

    /// The internal command in `slot` was found past its timeout and its
    /// withdrawal sent at `now_ms` (`accepted`: the controller gave it up;
    /// its ABORTED completion ends it as a failed command).
    pub(crate) fn withdrawn(&mut self, slot: u16, now_ms: u32, accepted: bool) {
        if !self.is_internal(slot) {
            return;
        }
        let map = match self.internal[usize::from(slot)] {
            Internal::Load { map, .. } | Internal::Inactivate { map, .. } => map,
            Internal::None => return,
        };
        if let Some(m) = self.maps.get(usize::from(map)) {
            m.c.internal_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        self.watch[usize::from(slot)] = if accepted {
            Watch::Withdrawn(now_ms)
        } else {
            Watch::Refused(now_ms)
        };
    }

    /// Give up the internal command in `slot`, whose tracker slot the
    /// queue pair retires (the device may still hold it): it ends as a
    /// failed command, and its map-load buffer is never reused (leaked with
    /// the others at drop). Returns whether it was internal.
    #[cold]
    pub(crate) fn give_up(&mut self, slot: u16) -> bool {
        let Some(k) = self.take(slot) else {
            return false;
        };
        self.leak = true;
        match k {
            Internal::Load { map, s, gen, .. } => {
                // The buffer stays out of `buf_free`: the device may still
                // write it.
                let m = &self.maps[usize::from(map)];
                m.finish_load(s as usize, gen, None);
                m.c.map_load_errors.fetch_add(1, Ordering::Relaxed);
                m.c.internal_given_up.fetch_add(1, Ordering::Relaxed);
            }
            Internal::Inactivate { map, rgn } => {
                let m = &self.maps[usize::from(map)];
                m.c.internal_given_up.fetch_add(1, Ordering::Relaxed);
                if self.wb_done.len() < self.wb_done.capacity() {
                    self.wb_done.push((map, rgn));
                }
            }
            Internal::None => {}
        }
        true
    }

    /// The queue pair ends the command in `slot` without a completion
    /// (controller failed, close withdrew it); `device_done`: the device no
    /// longer accesses its buffer. Returns whether it was internal.
    #[cold]
    pub(crate) fn abandon(&mut self, slot: u16, device_done: bool) -> bool {
        if !self.is_internal(slot) {
            return false;
        }
        if !device_done {
            self.leak = true;
        }
        self.complete(slot, false);
        true
    }

    /// Whether a policy pass is due (called once per poll).
    #[inline]
    pub(crate) fn pass_due(&mut self) -> bool {
        if !self.on {
            return false;
        }
        self.polls = self.polls.wrapping_add(1);
        !self.cands.is_empty()
            || !self.recs.is_empty()
            || !self.reloads.is_empty()
            || !self.fallbacks.is_empty()
            || !self.wb_done.is_empty()
            || self.polls % PASS_EVERY == 0
    }

    /// A policy pass: add this queue pair's counts, hand its candidates and
    /// the device's notices to each LU's policy (if no other queue pair
    /// holds it), and prepare up to `free` internal commands (see
    /// [`Self::next_cmd`]).
    #[cold]
    pub(crate) fn pass(&mut self, free: usize) {
        self.out.clear();
        let HpbQp {
            maps,
            local,
            cands,
            recs,
            reloads,
            fallbacks,
            wb_done,
            by_lun,
            out,
            buf_free,
            bufs,
            buf_len,
            inflight,
            max_inflight,
            ..
        } = self;
        for (mi, m) in maps.iter().enumerate() {
            let Some(mut p) = m.try_policy() else {
                continue;
            };
            let l = std::mem::take(&mut local[mi]);
            m.c.hpb_reads.fetch_add(l.hpb_reads, Ordering::Relaxed);
            m.c.normal_reads
                .fetch_add(l.normal_reads, Ordering::Relaxed);
            p.tick(m);
            p.count_reads(m, l.hpb_reads + l.normal_reads);
            let mi8 = mi as u8;
            recs.retain(|&(lun, b)| {
                if by_lun.get(usize::from(lun)) != Some(&mi8) {
                    // Another LU's (or a LUN we do not map): its own pass,
                    // or nobody's.
                    return by_lun.get(usize::from(lun)).is_some_and(|&x| x != NO_MAP);
                }
                match b[4] {
                    HPB_OP_DEV_RESET => {
                        m.c.reset_notices.fetch_add(1, Ordering::Relaxed);
                        p.rec_reset(m);
                    }
                    HPB_OP_REGION_UPDATE => {
                        let na = usize::from(b[6]).min(2);
                        let ni = usize::from(b[7]).min(2);
                        for i in 0..na {
                            let r = u16::from_be_bytes([b[8 + 4 * i], b[9 + 4 * i]]);
                            let s = u16::from_be_bytes([b[10 + 4 * i], b[11 + 4 * i]]);
                            m.c.active_recs.fetch_add(1, Ordering::Relaxed);
                            if !p.rec_active(m, r, s) {
                                m.c.bad_recs.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        for i in 0..ni {
                            let r = u16::from_be_bytes([b[16 + 2 * i], b[17 + 2 * i]]);
                            m.c.inactive_recs.fetch_add(1, Ordering::Relaxed);
                            if !p.rec_inactive(m, r) {
                                m.c.bad_recs.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    _ => {
                        m.c.bad_recs.fetch_add(1, Ordering::Relaxed);
                    }
                }
                false
            });
            fallbacks.retain(|&(x, s)| {
                if x != mi8 {
                    return true;
                }
                // The device no longer agrees with these entries: stop
                // using them and load them again.
                m.dirty(u64::from(s) << m.srgn_shift, 1);
                p.reload(m, s as usize);
                false
            });
            wb_done.retain(|&(x, r)| {
                if x != mi8 {
                    return true;
                }
                p.inactivation_done(r, false);
                false
            });
            reloads.retain(|&(x, s)| {
                if x != mi8 {
                    return true;
                }
                p.reload(m, s as usize);
                false
            });
            cands.retain(|&(x, s)| {
                if x != mi8 {
                    return true;
                }
                p.candidate(m, s as usize);
                false
            });
            while out.len() < free && *inflight + out.len() < *max_inflight && bufs.is_some() {
                let Some(b) = buf_free.pop() else { break };
                let Some((s, gen)) = p.next_load(m) else {
                    buf_free.push(b);
                    break;
                };
                let (rgn, srgn) = m.split(s as usize);
                let len = (m.srgn_len(s as usize) * 8) as u32;
                let iova = bufs
                    .as_ref()
                    .map_or(0, |d| d.iova().raw() + (usize::from(b) * *buf_len) as u64);
                out.push(Cmd {
                    lun: m.lun,
                    cdb: scsi::hpb_read_buffer(rgn, srgn, len),
                    data: Some((iova, len)),
                    kind: Internal::Load {
                        map: mi8,
                        s,
                        gen,
                        buf: b,
                    },
                });
            }
            while out.len() < free {
                let Some(r) = p.next_inactivation() else {
                    break;
                };
                out.push(Cmd {
                    lun: m.lun,
                    cdb: scsi::hpb_write_buffer(Some(r)),
                    data: None,
                    kind: Internal::Inactivate { map: mi8, rgn: r },
                });
            }
        }
        // Notices for LUs without a map are dropped.
        recs.retain(|&(lun, _)| by_lun.get(usize::from(lun)).is_some_and(|&x| x != NO_MAP));
        self.out.reverse();
    }

    /// The next command the last pass prepared.
    #[inline]
    pub(crate) fn next_cmd(&mut self) -> Option<Cmd> {
        self.out.pop()
    }

    /// `cmd` was posted in tracker `slot`.
    pub(crate) fn posted(&mut self, slot: u16, cmd: Cmd) {
        self.internal[usize::from(slot)] = cmd.kind;
        self.inflight += 1;
    }

    /// `cmd` could not be posted: undo it.
    pub(crate) fn refused(&mut self, cmd: Cmd) {
        match cmd.kind {
            Internal::Load { map, s, buf, .. } => {
                self.buf_free.push(buf);
                let m = &self.maps[usize::from(map)];
                m.policy().unload(m, s);
            }
            Internal::Inactivate { map, rgn } => {
                let m = &self.maps[usize::from(map)];
                m.policy().inactivation_done(rgn, true);
            }
            Internal::None => {}
        }
    }

    /// The device may still write the map-load buffers: never free them.
    pub(crate) fn leak_buffers(&mut self) {
        self.leak = true;
    }

    /// Bytes of map-load buffers the drop will leak (the device may still
    /// write them), for [`UfsController::leaked_bytes`](crate::ufs::UfsController::leaked_bytes).
    pub(crate) fn leaking_bytes(&self) -> u64 {
        match self.bufs.as_ref() {
            Some(b) if self.leak || self.inflight > 0 => b.len() as u64,
            _ => 0,
        }
    }
}

impl Drop for HpbQp {
    fn drop(&mut self) {
        for (mi, m) in self.maps.iter().enumerate() {
            let l = self.local[mi];
            m.c.hpb_reads.fetch_add(l.hpb_reads, Ordering::Relaxed);
            m.c.normal_reads
                .fetch_add(l.normal_reads, Ordering::Relaxed);
        }
        if self.leak || self.inflight > 0 {
            // SAFETY: taken once, here; the device may still write these
            // buffers, so they are leaked, never freed or reused.
            std::mem::forget(unsafe { ManuallyDrop::take(&mut self.bufs) });
        } else {
            // SAFETY: taken once, here; no internal command is in flight,
            // so the device no longer accesses them.
            drop(unsafe { ManuallyDrop::take(&mut self.bufs) });
        }
    }
}
