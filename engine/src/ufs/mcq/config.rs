//! MCQ queue configuration at bring-up and after a reset: each queue's
//! rings programmed, the DAO/ISAO offsets read back and bounds-checked,
//! MCQ mode selected (see the [controller's docs](crate::ufs::ctrl)).

use std::ptr::NonNull;
use std::sync::Arc;

use mcqio_vfio::{DmaDir, DmaRegion, DmaSpace};

use crate::ufs::ctrl::{in_bar, Regs, UfsController, MAX_DEPTH};
use crate::ufs::error::{UfsCtrlError, UfsResult};
use crate::ufs::mcq::{McqRegs, McqRings, OpReg};
use crate::ufs::spec::regs::{self, cq_op, qcfg, sq_op, Cap, McqCap, QueueAttr, QueueConfig};
use crate::ufs::spec::utrd::{DataDir, Utrd};

impl UfsController {
    /// Re-create MCQ queue `rings.index` on its rings after a reset, if
    /// the state is still `seen` (`Ok(None)`: it moved on, look again).
    /// The SQ ring is nullified first, so entries left from before the
    /// reset are never executed. Returns the queue's registers and where
    /// the host's SQ tail and CQ head start.
    pub(crate) fn recreate_mcq_queue(
        &self,
        seen: u64,
        rings: &McqRings,
    ) -> UfsResult<Option<(McqRegs, u32, u32)>> {
        let _g = self.lock_reset();
        if self.state.load_acquire() != seen {
            return Ok(None);
        }
        let mmio = self.backend.regs();
        let r = Regs(mmio);
        let mcap = McqCap(r.read(regs::MCQCAP)?);
        enable_queue(
            &r,
            mcap,
            u32::from(rings.index),
            &rings.sq,
            &rings.cq,
            rings.entries,
            (mmio.base(), mmio.len()),
            true,
        )
        .map(Some)
    }
}

/// Overwrite every SQ slot with a nullified UTRD: whatever the controller
/// still finds between its head and tail is consumed without execution.
pub(in crate::ufs) fn nullify_ring(sq: &mut DmaRegion, entries: u16) -> UfsResult<()> {
    let n = Utrd::new(0, DataDir::None, 0).nullified();
    for i in 0..usize::from(entries) {
        sq.write_obj(i * 32, n)?;
    }
    Ok(())
}

/// Leave the legacy list and select MCQ mode (after the queues are set up).
pub(in crate::ufs) fn select_mcq(r: &Regs<'_>, cap: Cap) -> UfsResult<()> {
    // The legacy list is no longer used.
    r.write(regs::UTRLRSR, 0);
    r.write(regs::MCQ_CFG, regs::mcq_cfg_mac(cap.mcq_mac()));
    r.write(regs::MEM_CFG, regs::MEM_CFG_MCQ_MODE);
    if r.read(regs::MEM_CFG)? & regs::MEM_CFG_MCQ_MODE == 0 {
        return Err(UfsCtrlError::QueueRefused {
            queue: 0,
            what: "MCQ mode",
        });
    }
    Ok(())
}

/// Program `min(requested, MAXQ, 32)` queues; each ring gets `MAX_DEPTH + 1`
/// slots (at most `depth` commands are ever outstanding on it). The rings
/// go to `rings` as they are enabled; those of a queue whose enable failed
/// half-way go to `given`: the controller may hold either, so the caller
/// frees them only once the controller is disabled.
pub(in crate::ufs) fn setup_mcq(
    r: &Regs<'_>,
    space: &Arc<DmaSpace>,
    (bar, bar_len): (NonNull<u8>, usize),
    depth: u16,
    requested: u16,
    (rings, given): (&mut Vec<McqRings>, &mut Vec<DmaRegion>),
) -> UfsResult<u16> {
    let mcap = McqCap(r.read(regs::MCQCAP)?);
    let maxq = mcap.max_queues();
    let cfg = mcap.config_offset();
    if cfg < regs::MCQ_CFG + 4 {
        return Err(UfsCtrlError::BadValue {
            what: "MCQCAP.QCFGPTR",
            value: cfg as u64,
            why: "the queue configuration array would overlap the host registers",
        });
    }
    // The whole array MAXQ implies must be inside the BAR.
    in_bar(
        "MCQ queue configuration array (MCQCAP.MAXQ)",
        cfg as u64,
        regs::QCFG_SIZE * maxq as usize,
        bar_len,
    )?;
    let n = u32::from(requested).min(maxq).min(32);
    // Every ring gets the slots of the deepest queue this engine makes,
    // whatever `depth` is (the trackers bound what is outstanding): QEMU
    // (10.0) keeps each queue's head and tail across the HCE reset and the
    // re-enable, even past the end of a smaller new ring, so a ring only as
    // large as `depth + 1` could not follow an earlier, deeper owner (QD 1
    // after QD 32: "SQHP after enable: 0xa0"). 2 × 257 × 32 B per queue.
    let entries = (depth + 1).max(MAX_DEPTH + 1);
    // Every queue's register blocks, clear of each other's, before any
    // queue is enabled.
    let mut taken = Vec::with_capacity(4 * n as usize);
    for i in 0..n {
        let b = queue_blocks(r, mcap, i, bar_len, &taken)?;
        taken.extend(b);
    }
    disable_queues(r, mcap)?;
    rings.reserve(n as usize);
    for i in 0..n {
        let sq = space.alloc(usize::from(entries) * 32, DmaDir::Bidirectional)?;
        let cq = space.alloc(usize::from(entries) * 32, DmaDir::Bidirectional)?;
        let (regs, sq_tail, cq_head) =
            match enable_queue(r, mcap, i, &sq, &cq, entries, (bar, bar_len), false) {
                Ok(x) => x,
                Err(e) => {
                    given.push(sq);
                    given.push(cq);
                    return Err(e);
                }
            };
        rings.push(McqRings {
            index: i as u16,
            entries,
            sq,
            cq,
            regs,
            sq_tail,
            cq_head,
            ucds: None,
        });
    }
    Ok(n as u16)
}

/// Disable every queue still enabled (each SQ before its CQ). QEMU (10.0)
/// keeps queues enabled, on the previous owner's rings, across the HCE
/// reset, and programming an enabled queue does not move it.
pub(in crate::ufs) fn disable_queues(r: &Regs<'_>, mcap: McqCap) -> UfsResult<()> {
    let maxq = mcap.max_queues();
    for i in 0..maxq.min(32) {
        let q = QueueConfig::new(mcap, i);
        if QueueAttr(r.read(q.reg(qcfg::SQATTR))?).is_enabled() {
            r.write(q.reg(qcfg::SQATTR), 0);
        }
    }
    for i in 0..maxq.min(32) {
        let q = QueueConfig::new(mcap, i);
        if QueueAttr(r.read(q.reg(qcfg::CQATTR))?).is_enabled() {
            r.write(q.reg(qcfg::CQATTR), 0);
        }
    }
    Ok(())
}

/// A register block the controller placed: what it is, its offset, its
/// length in bytes.
pub(in crate::ufs) type Block = (&'static str, usize, usize);

/// Read queue `i`'s SQ doorbell, SQ interrupt, CQ doorbell and CQ
/// interrupt blocks (DAO/ISAO) and check them: inside the BAR, 4-byte
/// aligned, clear of the host registers, of the queue configuration array,
/// of each other and of `others` (blocks already accepted). A doorbell
/// store into an overlapping block would land in another register.
pub(in crate::ufs) fn queue_blocks(
    r: &Regs<'_>,
    mcap: McqCap,
    i: u32,
    bar_len: usize,
    others: &[Block],
) -> UfsResult<[Block; 4]> {
    let q = QueueConfig::new(mcap, i);
    let mut blocks = [
        ("SQ doorbell block (SQDAO)", qcfg::SQDAO, 0x14),
        ("SQ interrupt block (SQISAO)", qcfg::SQISAO, 8),
        ("CQ doorbell block (CQDAO)", qcfg::CQDAO, 8),
        ("CQ interrupt block (CQISAO)", qcfg::CQISAO, 8),
    ];
    let host = ("the host controller registers", 0, regs::MCQ_CFG + 4);
    let array = (
        "the queue configuration array",
        mcap.config_offset(),
        regs::QCFG_SIZE * mcap.max_queues() as usize,
    );
    let overlap = |a: &Block, b: &Block| a.1 < b.1.saturating_add(b.2) && b.1 < a.1 + a.2;
    for k in 0..blocks.len() {
        let (what, reg, len) = blocks[k];
        let at = in_bar(what, u64::from(r.read(q.reg(reg))?), len, bar_len)?;
        blocks[k] = (what, at, len);
        let b = blocks[k];
        let clash = [host, array]
            .iter()
            .chain(&blocks[..k])
            .chain(others)
            .any(|o| overlap(&b, o));
        if clash {
            return Err(UfsCtrlError::BadValue {
                what,
                value: at as u64,
                why: "overlaps the host registers, the configuration array or another queue register block",
            });
        }
    }
    Ok(blocks)
}

/// Program queue `i` (disabled) on rings `sq`/`cq` of `entries` slots and
/// enable it, CQ before SQ; read the DAO/ISAO offsets back and check them
/// against the BAR. `resync` (after a reset, on a nullified SQ ring): an
/// SQ tail ahead of the head is set back to it. Returns its operational registers and where the
/// host's SQ tail and CQ head start.
#[allow(clippy::too_many_arguments)]
pub(in crate::ufs) fn enable_queue(
    r: &Regs<'_>,
    mcap: McqCap,
    i: u32,
    sq: &DmaRegion,
    cq: &DmaRegion,
    entries: u16,
    (bar, bar_len): (NonNull<u8>, usize),
    resync: bool,
) -> UfsResult<(McqRegs, u32, u32)> {
    let q = QueueConfig::new(mcap, i);
    let (s, c) = (sq.iova().raw(), cq.iova().raw());
    r.write(q.reg(qcfg::SQLBA), s as u32);
    r.write(q.reg(qcfg::SQUBA), (s >> 32) as u32);
    r.write(q.reg(qcfg::CQLBA), c as u32);
    r.write(q.reg(qcfg::CQUBA), (c >> 32) as u32);
    // The offsets are the controller's: read them back and use them.
    let blocks = queue_blocks(r, mcap, i, bar_len, &[])?;
    let (sqdao, cqdao, cqisao) = (blocks[0].1, blocks[2].1, blocks[3].1);
    r.write(q.reg(qcfg::CQATTR), QueueAttr::enabled(entries, 0).0);
    if !QueueAttr(r.read(q.reg(qcfg::CQATTR))?).is_enabled() {
        return Err(UfsCtrlError::QueueRefused {
            queue: i,
            what: "CQ",
        });
    }
    r.write(q.reg(qcfg::SQATTR), QueueAttr::enabled(entries, i as u8).0);
    if !QueueAttr(r.read(q.reg(qcfg::SQATTR))?).is_enabled() {
        return Err(UfsCtrlError::QueueRefused {
            queue: i,
            what: "SQ",
        });
    }
    // Where the controller's pointers stand. UFSHCI starts an enabled
    // queue at 0, but QEMU (10.0) keeps SQHP/SQTP/CQHP/CQTP across a
    // host controller reset and a re-enable: a ring that started at 0
    // there makes it fetch slots nobody wrote. Start where it stands
    // (nothing may be pending in the SQ); drop leftover CQ entries.
    let slot = |what: &'static str, v: u32| -> UfsResult<u32> {
        if v % 32 != 0 || v / 32 >= u32::from(entries) {
            return Err(UfsCtrlError::BadValue {
                what,
                value: u64::from(v),
                why: "not a slot of the ring just enabled",
            });
        }
        Ok(v / 32)
    };
    let sq_head = slot("SQHP after enable", r.read(sqdao + sq_op::SQHP)?)?;
    let mut sq_tail = slot("SQTP after enable", r.read(sqdao + sq_op::SQTP)?)?;
    let cq_tail = slot("CQTP after enable", r.read(cqdao + cq_op::CQTP)?)?;
    if sq_head != sq_tail && resync {
        // After a reset, on a nullified ring: a tail a doorbell store left
        // (one that raced the reset) is taken back to the head.
        r.write(sqdao + sq_op::SQTP, sq_head * 32);
        sq_tail = slot("SQTP after resync", r.read(sqdao + sq_op::SQTP)?)?;
    }
    if sq_head != sq_tail {
        return Err(UfsCtrlError::BadValue {
            what: "SQHP after enable",
            value: u64::from(sq_head) * 32,
            why: "differs from SQTP: the new SQ would start with entries pending",
        });
    }
    if slot("CQHP after enable", r.read(cqdao + cq_op::CQHP)?)? != cq_tail {
        r.write(cqdao + cq_op::CQHP, cq_tail * 32);
    }
    let op = |o: usize| {
        // SAFETY: every offset was checked above to be 4-byte aligned
        // with the whole block inside the BAR mapped at `bar`, which the
        // backend keeps alive as long as the controller (and every queue
        // pair holds the controller).
        unsafe { OpReg::new(bar, o) }
    };
    let regs = McqRegs {
        sqtp: op(sqdao + sq_op::SQTP),
        sqrtc: op(sqdao + sq_op::SQRTC),
        sqcti: op(sqdao + sq_op::SQCTI),
        sqrts: op(sqdao + sq_op::SQRTS),
        cqhp: op(cqdao + cq_op::CQHP),
        cqtp: op(cqdao + cq_op::CQTP),
        cqis: op(cqisao + regs::cq_int::CQIS),
        cqie: op(cqisao + regs::cq_int::CQIE),
    };
    Ok((regs, sq_tail, cq_tail))
}
