//! Bring-up of the controller and its device (see the [module docs](super)):
//! HCE, DME_LINKSTARTUP, device management on a fresh legacy list,
//! descriptors, LU discovery; and the way down: disable, abandon, `Drop`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcqio_vfio::{Backend, DmaDir, DmaSpace};

use crate::ufs::error::{UfsCtrlError, UfsResult};
use crate::ufs::mcq::config::{disable_queues, enable_queue, nullify_ring, select_mcq, setup_mcq};
use crate::ufs::spec::desc::{self, DeviceDesc, GeometryDesc, UnitDesc};
use crate::ufs::spec::regs::{self, is, uic, Cap, Hcs, McqCap};
use crate::ufs::spec::status::UfsError;
use crate::ufs::spec::utrd::{Ocs, Ucd};

use super::devcmd::{DevCmd, DEV_DATA, QUERY_INVALID_INDEX};
use super::{
    in_bar, state, wait_until, LogicalUnit, Pool, QueueLayout, Regs, UfsController, UfsMode,
    UfsOptions, MAX_DEPTH, TASK_TAGS,
};

/// What differs between the logical units found at bring-up (`was`) and
/// after a reset (`now`), for [`UfsCtrlError::DeviceChanged`].
fn lus_changed(was: &[LogicalUnit], now: &[LogicalUnit]) -> String {
    for w in was {
        match now.iter().find(|n| n.lun == w.lun) {
            None => return format!("LU {} is gone", w.lun),
            Some(n) if n != w => {
                return format!(
                    "LU {} has {} blocks of {} B, {} of {} B at bring-up",
                    w.lun, n.blocks, n.block_len, w.blocks, w.block_len
                )
            }
            Some(_) => {}
        }
    }
    match now.iter().find(|n| !was.iter().any(|w| w.lun == n.lun)) {
        Some(n) => format!("LU {} is new", n.lun),
        None => "the logical units differ".into(),
    }
}

/// Slots of the legacy list.
const UTRL_SLOTS: u32 = 32;
/// DME_LINKSTARTUP attempts.
const LINK_ATTEMPTS: u32 = 3;

impl UfsController {
    /// Bring up the controller behind `backend` and its device (see the
    /// module docs).
    pub fn new(backend: Arc<dyn Backend>, opts: UfsOptions) -> UfsResult<Arc<Self>> {
        if opts.depth == 0 || opts.queues == 0 {
            return Err(UfsCtrlError::InvalidOption(
                "depth and queues must be at least 1".into(),
            ));
        }
        if opts.max_transfer == 0 || opts.max_transfer % 4 != 0 {
            return Err(UfsCtrlError::InvalidOption(
                "max_transfer must be a non-zero multiple of 4".into(),
            ));
        }
        let mmio = backend.regs();
        let bar_len = mmio.len();
        in_bar("host controller registers", 0, regs::UCMDARG3 + 4, bar_len)?;
        let r = Regs(mmio);
        let cap = Cap(r.read(regs::CAP)?);
        let t = opts.init_timeout;

        let init = init_device(&r, backend.dma(), cap, bar_len, opts.max_transfer, t)?;
        let (device, geometry, lus) = (init.device, init.geometry, init.lus);
        let space = backend.dma();
        let mut dc = init.dc;
        let legacy_list = dc.utrl.iova().raw();
        // Memory the controller was given by a step that failed: freed only
        // once the controller is disabled.
        let mut given = Vec::new();
        let mut rings = Vec::new();
        let mut depth = opts.depth.min(MAX_DEPTH);
        let up = (|| {
            let hpb = match &opts.hpb {
                Some(h) => crate::ufs::hpb::enable(
                    h,
                    &init.dev_raw,
                    &init.geo_raw,
                    &init.unit_raw,
                    &lus,
                    &mut |q| dc.hpb_query(&r, t, q),
                )?,
                None => Vec::new(),
            };

            // 4. MCQ or legacy.
            if device.queue_depth != 0 {
                depth = depth.min(u16::from(device.queue_depth));
            }
            let bar = mmio.base();
            let mcq = if cap.mcq() && opts.mcq {
                in_bar(
                    "MEM_CFG / MCQ_CFG",
                    regs::MEM_CFG as u64,
                    regs::MCQ_CFG + 4 - regs::MEM_CFG,
                    bar_len,
                )?;
                depth = depth.min(cap.mcq_mac() as u16);
                let n = setup_mcq(
                    &r,
                    space,
                    (bar, bar_len),
                    depth,
                    opts.queues,
                    (&mut rings, &mut given),
                )?;
                // Task tags: queue `i` uses `i * depth ..` (see `create_qpair`);
                // `n * depth` of them must fit the 8-bit tag.
                depth = depth.min(TASK_TAGS / n.max(1));
                select_mcq(&r, cap)?;
                Some(n)
            } else {
                depth = depth.min(cap.sdb_slots() as u16);
                None
            };
            r.check_fatal()?;
            Ok((hpb, mcq))
        })();
        let (hpb, mcq) = match up {
            Ok(x) => x,
            Err(e) => {
                abandon(&r, t, (dc, given, rings));
                return Err(e);
            }
        };
        let (mode, pool) = match mcq {
            Some(n) => (
                UfsMode::Mcq { queues: n },
                Pool::Mcq(rings.into_iter().map(Some).collect()),
            ),
            // The list (idle: every request above completed) goes to the
            // one queue pair legacy mode has.
            None => (UfsMode::Legacy, Pool::Legacy(Some(dc.utrl))),
        };
        Ok(Arc::new(UfsController {
            mode,
            depth,
            lus,
            device,
            geometry,
            opts,
            pool: Mutex::new(pool),
            state: crate::core::state::StateWord::default(),
            reset_lock: Mutex::new(()),
            resets: AtomicU64::new(0),
            layout: QueueLayout { cap, legacy_list },
            leaked: AtomicU64::new(0),
            hpb,
            irq: Mutex::new(None),
            backend,
        }))
    }

    /// HCE = 0 and wait (bounded) until it reads 0: from then on the
    /// controller has dropped every queue and command and no longer
    /// accesses their memory.
    pub(super) fn disable(&self) -> UfsResult<()> {
        let r = Regs(self.backend.regs());
        r.write(regs::HCE, 0);
        wait_until(
            self.opts.init_timeout,
            "clear HCE (disable the host controller)",
            || Ok(r.read(regs::HCE)? & regs::HCE_ENABLE == 0),
        )
    }

    /// Bring-up after a disable (reset lock held): the same steps as
    /// [`UfsController::new`], the same device, the same queue layout.
    /// Pooled queues are set up here; queues held by queue pairs are
    /// re-created by their pair ([`Self::recreate_mcq_queue`],
    /// [`Self::restart_legacy_list`]).
    pub(super) fn reinit(&self) -> UfsResult<()> {
        let mmio = self.backend.regs();
        let (bar, bar_len) = (mmio.base(), mmio.len());
        let r = Regs(mmio);
        let cap = self.layout.cap;
        let now = r.read(regs::CAP)?;
        if Cap(now) != cap {
            return Err(UfsCtrlError::DeviceChanged(format!(
                "CAP reads {now:#010x}, {:#010x} at bring-up",
                cap.0
            )));
        }
        let init = init_device(
            &r,
            self.dma(),
            cap,
            bar_len,
            self.opts.max_transfer,
            self.opts.init_timeout,
        )?;
        if init.lus != self.lus {
            return Err(UfsCtrlError::DeviceChanged(lus_changed(
                &self.lus, &init.lus,
            )));
        }
        let mut dc = init.dc;
        if self.hpb.iter().any(Option::is_some) {
            // The reset cleared the device's HPB state: enable it again (on
            // the management list, before the queues take the controller)
            // and reload what the host had active.
            let t = self.opts.init_timeout;
            crate::ufs::hpb::after_reset(&self.hpb, &mut |q| dc.hpb_query(&r, t, q))?;
        }
        let mut pool = self.lock_pool();
        match &mut *pool {
            Pool::Mcq(rings) => {
                let mcap = McqCap(r.read(regs::MCQCAP)?);
                disable_queues(&r, mcap)?;
                for ring in rings.iter_mut().flatten() {
                    nullify_ring(&mut ring.sq, ring.entries)?;
                    let (regs, sq_tail, cq_head) = enable_queue(
                        &r,
                        mcap,
                        u32::from(ring.index),
                        &ring.sq,
                        &ring.cq,
                        ring.entries,
                        (bar, bar_len),
                        true,
                    )?;
                    ring.regs = regs;
                    ring.sq_tail = sq_tail;
                    ring.cq_head = cq_head;
                }
                select_mcq(&r, cap)?;
            }
            Pool::Legacy(list) => {
                // Device management ran on its own list; the queue pair's
                // list goes back in (now if pooled, else by the pair).
                r.write(regs::UTRLRSR, 0);
                if list.is_some() {
                    start_list(&r, self.layout.legacy_list);
                }
            }
        }
        drop(pool);
        r.check_fatal()?;
        drop(dc);
        Ok(())
    }
}

/// Program and run the legacy list at `iova` (the list is idle).
pub(super) fn start_list(r: &Regs<'_>, iova: u64) {
    r.write(regs::UTRLRSR, 0);
    r.write(regs::UTRLBA, iova as u32);
    r.write(regs::UTRLBAU, (iova >> 32) as u32);
    r.write(regs::UTRLRSR, 1);
}

impl Drop for UfsController {
    /// Every queue pair is gone (each holds the controller): disable the
    /// controller before the pooled queue memory is freed, so nothing the
    /// controller might still fetch is unmapped under it.
    /// A controller that does not read disabled within
    /// [`UfsOptions::init_timeout`] might still write that memory: it is
    /// leaked instead.
    fn drop(&mut self) {
        if self.health() == state::GONE {
            return;
        }
        let r = Regs(self.backend.regs());
        if !disable(&r, self.opts.init_timeout) {
            log::error!("UFS host controller cannot be disabled: leaking its queue memory");
            let pool = std::mem::replace(
                self.pool.get_mut().unwrap_or_else(|p| p.into_inner()),
                Pool::Legacy(None),
            );
            std::mem::forget(pool);
        }
    }
}

/// What steps 1–3 of bring-up found.
struct Init {
    dc: DevCmd,
    device: DeviceDesc,
    geometry: GeometryDesc,
    lus: Vec<LogicalUnit>,
    /// The raw device, geometry and unit descriptors (HPB reads fields of
    /// its own from them).
    dev_raw: Vec<u8>,
    geo_raw: Vec<u8>,
    unit_raw: Vec<(u8, Vec<u8>)>,
}

/// Bring-up steps 1–3 (see the module docs): HCE, link start-up, device
/// management on a fresh legacy list. Used by [`UfsController::new`] and
/// again by [`UfsController::reset`].
fn init_device(
    r: &Regs<'_>,
    space: &Arc<DmaSpace>,
    cap: Cap,
    bar_len: usize,
    max_transfer: u32,
    t: Duration,
) -> UfsResult<Init> {
    // 1. Host controller enable.
    if r.read(regs::HCE)? & regs::HCE_ENABLE != 0 {
        r.write(regs::HCE, 0);
        wait_until(t, "clear HCE", || {
            Ok(r.read(regs::HCE)? & regs::HCE_ENABLE == 0)
        })?;
    }
    // A previous owner may have left MCQ mode selected; QEMU (10.0)
    // keeps it across the HCE reset, and device management below
    // travels on the legacy list.
    if cap.mcq()
        && bar_len >= regs::MEM_CFG + 4
        && r.read(regs::MEM_CFG)? & regs::MEM_CFG_MCQ_MODE != 0
    {
        r.write(regs::MEM_CFG, 0);
    }
    r.write(regs::HCE, regs::HCE_ENABLE);
    wait_until(t, "set HCE and HCS.UCRDY", || {
        Ok(r.read(regs::HCE)? & regs::HCE_ENABLE != 0 && Hcs(r.read(regs::HCS)?).uic_ready())
    })?;

    // 2. Link start-up.
    link_startup(r, t)?;
    if !Hcs(r.read(regs::HCS)?).device_present() {
        return Err(UfsCtrlError::NoDevice);
    }

    // 3. Legacy list for device management.
    let mut dc = DevCmd {
        utrl: space.alloc(UTRL_SLOTS as usize * 32, DmaDir::Bidirectional)?,
        ucd: space.alloc(Ucd::size(1), DmaDir::Bidirectional)?,
        data: space.alloc(DEV_DATA, DmaDir::Bidirectional)?,
        next_tag: 0,
    };
    // From here on the controller may hold the list and what it points at.
    let found = (|| {
        wait_until(t, "set HCS.UTRLRDY", || {
            Ok(Hcs(r.read(regs::HCS)?).utrl_ready())
        })?;
        let utrl = dc.utrl.iova().raw();
        if utrl % 1024 != 0 || (!cap.addr64() && utrl >> 32 != 0) {
            return Err(UfsCtrlError::BadValue {
                what: "UTRL address",
                value: utrl,
                why: "the list must be 1 KiB aligned and reachable by the controller",
            });
        }
        r.write(regs::UTRLBA, utrl as u32);
        r.write(regs::UTRLBAU, (utrl >> 32) as u32);
        r.write(regs::UTRLRSR, 1);

        dc.nop(r, t)?;
        dc.device_init(r, t)?;
        let dev_raw = dc.read_desc(r, t, desc::idn::DEVICE, 0)?;
        let geo_raw = dc.read_desc(r, t, desc::idn::GEOMETRY, 0)?;
        let device = DeviceDesc::parse(&dev_raw)?;
        let geometry = GeometryDesc::parse(&geo_raw)?;
        let mut unit_raw = Vec::new();
        let mut units = Vec::new();
        for i in 0..geometry.max_lus {
            // bNumberLU counts the enabled LUs: past the last one there is
            // nothing to find (and QEMU has no descriptor to read).
            if units.len() >= usize::from(device.lus) {
                break;
            }
            let d = match dc.read_desc(r, t, desc::idn::UNIT, i) {
                Ok(d) => d,
                // No unit descriptor at this index. UFS 4.0 devices return
                // one with bLUEnable = 0 for an absent LU; QEMU (10.0)
                // answers INVALID_INDEX instead and also fails the request
                // with OCS INVALID_CMD_TABLE_ATTR. Either way: no LU here.
                Err(UfsCtrlError::Query { code, .. }) if code == QUERY_INVALID_INDEX => continue,
                Err(UfsCtrlError::DevCmd {
                    err: UfsError::Transport(ocs),
                    ..
                }) if ocs == Ocs::INVALID_CMD_TABLE_ATTR => continue,
                Err(e) => return Err(e),
            };
            // A disabled LU's descriptor holds no usable geometry: look at
            // bLUEnable (byte 3) before asking the rest to make sense
            // (1 = enabled, 2 = enabled HPB LU).
            if !matches!(d.get(3), Some(&1) | Some(&2)) {
                continue;
            }
            let u = UnitDesc::parse(&d)?;
            if u.enabled {
                if u.lun != i {
                    return Err(UfsCtrlError::BadValue {
                        what: "unit descriptor bUnitIndex",
                        value: u64::from(u.lun),
                        why: "differs from the index asked for",
                    });
                }
                units.push(u);
                unit_raw.push((i, d));
            }
        }
        if units.is_empty() {
            return Err(UfsCtrlError::NoLogicalUnits);
        }
        let reported = dc.report_luns(r, t, units[0].lun)?;
        let mut lus = Vec::new();
        for u in units.iter().filter(|u| reported.contains(&u.lun)) {
            dc.clear_unit_attention(r, t, u.lun)?;
            let c = dc.read_capacity(r, t, u.lun)?;
            if !c.block_len.is_power_of_two() || c.block_len < 512 || c.block_len > 1 << 20 {
                return Err(UfsCtrlError::BadValue {
                    what: "READ CAPACITY(16) block length",
                    value: u64::from(c.block_len),
                    why: "not a power of two between 512 B and 1 MiB",
                });
            }
            if c.block_len != 1 << u.block_shift {
                return Err(UfsCtrlError::BadValue {
                    what: "unit descriptor bLogicalBlockSize",
                    value: u64::from(u.block_shift),
                    why: "disagrees with the block length READ CAPACITY(16) reports",
                });
            }
            // The smaller of the two counts: never address past either.
            let blocks = if u.blocks == 0 {
                c.blocks
            } else {
                c.blocks.min(u.blocks)
            };
            if blocks.checked_mul(u64::from(c.block_len)).is_none() {
                return Err(UfsCtrlError::BadValue {
                    what: "LU capacity (READ CAPACITY(16), qLogicalBlockCount)",
                    value: blocks,
                    why: "blocks of this length overflow 64 bits of bytes",
                });
            }
            lus.push(LogicalUnit {
                lun: u.lun,
                blocks,
                block_len: c.block_len,
                // One block must fit in one command (the PRDT limit, 64 MiB,
                // is above any block length accepted here): else this LU alone
                // is unusable, not the controller.
                usable: c.block_len <= max_transfer,
            });
            if c.block_len > max_transfer {
                log::warn!(
                    "LU {}: {} B blocks but one command moves at most {max_transfer} B: reads and writes to it are refused",
                    u.lun,
                    c.block_len
                );
            }
        }
        if lus.is_empty() {
            return Err(UfsCtrlError::NoLogicalUnits);
        }
        Ok((device, geometry, lus, dev_raw, geo_raw, unit_raw))
    })();
    let (device, geometry, lus, dev_raw, geo_raw, unit_raw) = match found {
        Ok(x) => x,
        Err(e) => {
            abandon(r, t, dc);
            return Err(e);
        }
    };
    Ok(Init {
        dc,
        device,
        geometry,
        lus,
        dev_raw,
        geo_raw,
        unit_raw,
    })
}

/// DME_LINKSTARTUP, retried a bounded number of times on a non-zero result.
fn link_startup(r: &Regs<'_>, t: Duration) -> UfsResult<()> {
    let mut result = 0;
    for _ in 0..LINK_ATTEMPTS {
        wait_until(t, "set HCS.UCRDY", || {
            Ok(Hcs(r.read(regs::HCS)?).uic_ready())
        })?;
        r.write(regs::IS, is::UCCS);
        r.write(regs::UCMDARG1, 0);
        r.write(regs::UCMDARG2, 0);
        r.write(regs::UCMDARG3, 0);
        r.write(regs::UICCMD, uic::DME_LINKSTARTUP);
        wait_until(t, "complete DME_LINKSTARTUP (IS.UCCS)", || {
            Ok(r.read(regs::IS)? & is::UCCS != 0)
        })?;
        r.write(regs::IS, is::UCCS);
        result = uic::result(r.read(regs::UCMDARG2)?);
        if result == 0 {
            return Ok(());
        }
    }
    Err(UfsCtrlError::Uic {
        cmd: uic::DME_LINKSTARTUP,
        result,
        attempts: LINK_ATTEMPTS,
    })
}

/// Disable the controller (HCE = 0) and wait, bounded by `t`, until it
/// reads disabled. Whether it did: only then has it stopped touching host
/// memory.
fn disable(r: &Regs<'_>, t: Duration) -> bool {
    r.write(regs::HCE, 0);
    wait_until(t, "clear HCE", || {
        Ok(r.read(regs::HCE)? & regs::HCE_ENABLE == 0)
    })
    .is_ok()
}

/// A bring-up step failed after the controller was given `memory`
/// (queues, the legacy list, command descriptors, data pages): disable the
/// controller before that memory is freed; one that cannot be disabled
/// (or is gone) might still write it, so it is leaked.
fn abandon<T>(r: &Regs<'_>, t: Duration, memory: T) {
    if !disable(r, t) {
        log::error!(
            "UFS bring-up failed and the controller cannot be disabled: leaking its memory"
        );
        std::mem::forget(memory);
    }
}
