//! Creation: [`QueuePair`]'s rings, PRP pages, doorbells and interrupt
//! vector, the Create I/O CQ/SQ commands that hand them to the
//! controller, and the ring sizes for a depth.

use super::prp::{prp_pages_per_slot, prp_region_len, PrpLists};
use super::{NsGeom, QueuePair, Teardown, MAX_DEPTH};
use crate::core::error::{Error, Result};
use crate::core::io::{DmaBuf, IoBuf};
use crate::core::qpair::Engine;
use crate::nvme::host::QpairOptions;
use crate::nvme::pcie::controller::Controller;
use crate::nvme::pcie::queue::cq::CompQueue;
use crate::nvme::pcie::queue::doorbell::Doorbell;
use crate::nvme::pcie::queue::sq::SubQueue;
use crate::nvme::pcie::queue::PAGE_MASK;
use crate::nvme::pcie::queue::PAGE_SIZE;
use crate::nvme::spec::sqe::MAX_NLB;
use crate::nvme::spec::{regs, Cqe, Sqe};
use mcqio_vfio::DmaDir;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

impl Controller {
    /// Create an I/O queue pair for [`DmaBuf`] buffers. `opts.mapping`
    /// must be [`MappingMode::Premapped`](crate::core::mapped::MappingMode::Premapped):
    /// strict and lazy modes take application buffers, through
    /// [`Controller::create_mapped_qpair`].
    pub fn create_qpair(self: &Arc<Self>, opts: QpairOptions) -> Result<QueuePair<DmaBuf>> {
        Self::premapped_only(&opts)?;
        QueuePair::create(self, &opts)
    }

    /// Create an I/O queue pair moving buffers of type `B` (e.g.
    /// `Vec<DmaBuf>` for vectored I/O, or a mapping layer's buffer type).
    /// `opts.mapping` must be premapped, as for [`Controller::create_qpair`].
    pub fn create_qpair_for<B: IoBuf>(
        self: &Arc<Self>,
        opts: QpairOptions,
    ) -> Result<QueuePair<B>> {
        Self::premapped_only(&opts)?;
        QueuePair::create(self, &opts)
    }

    fn premapped_only(opts: &QpairOptions) -> Result<()> {
        match opts.mapping {
            crate::core::mapped::MappingMode::Premapped => Ok(()),
            ref m => Err(Error::InvalidOption(format!(
                "mapping {m:?} maps application buffers per I/O: create the queue pair with Controller::create_mapped_qpair"
            ))),
        }
    }
}

impl<B: IoBuf> QueuePair<B> {
    pub(crate) fn create(ctrl: &Arc<Controller>, opts: &QpairOptions) -> Result<Self> {
        let mqes = ctrl.cap().max_queue_entries();
        let rings = ring_entries(opts.depth, opts.queue_entries, mqes)?;
        let qid = ctrl.alloc_qid()?;
        match Self::create_with_qid(ctrl, opts, qid, rings) {
            Ok(qp) => Ok(qp),
            Err((e, queue_left)) => {
                // A queue the controller may still have keeps its id.
                if !queue_left {
                    ctrl.release_qid(qid);
                }
                Err(e)
            }
        }
    }

    /// `Err((e, true))`: the controller may still have a queue `qid` on
    /// the rings, which were leaked.
    fn create_with_qid(
        ctrl: &Arc<Controller>,
        opts: &QpairOptions,
        qid: u16,
        rings: Rings,
    ) -> Result<Self, (Error, bool)> {
        let Rings {
            entries,
            cq_head_batch,
            cq_head_after_sq,
        } = rings;
        // Errors before the Create commands leave nothing on the controller.
        let none_left = |e: Error| (e, false);
        let dstrd = ctrl.cap().dstrd();
        let bar_len = ctrl.backend().regs().len();
        if regs::cq_head_doorbell(qid, dstrd) + 4 > bar_len {
            return Err(none_left(Error::InvalidOption(format!(
                "queue {qid}'s doorbell lies beyond the {bar_len}-byte BAR; the controller granted more queues than its BAR has doorbells for"
            ))));
        }
        let space = Arc::clone(ctrl.dma());
        let max_xfer = ctrl.max_transfer();
        let prp_pages = prp_pages_per_slot(ctrl, max_xfer).map_err(none_left)?;
        let prp_bytes = prp_region_len(opts.depth, prp_pages, space.granule())
            .ok_or_else(|| {
                Error::InvalidOption(format!(
                    "{} PRP list pages for each of {} commands do not fit in memory",
                    prp_pages, opts.depth
                ))
            })
            .map_err(none_left)?;
        let alloc = |len: usize, dir| space.alloc(len, dir).map_err(|e| none_left(e.into()));
        let cq_mem = alloc(entries as usize * size_of::<Cqe>(), DmaDir::Bidirectional)?;
        let sq_mem = alloc(entries as usize * size_of::<Sqe>(), DmaDir::ToDevice)?;
        let prp_mem = alloc(prp_bytes, DmaDir::ToDevice)?;
        if prp_mem.iova().raw() & PAGE_MASK != 0 {
            return Err(none_left(Error::InvalidOption(format!(
                "the DMA space placed the PRP lists at IOVA {}, not on a {PAGE_SIZE}-byte controller page",
                prp_mem.iova()
            ))));
        }
        let (sq_shadow, cq_shadow) = ctrl.shadow_slots(qid);
        let hook = ctrl.backend().doorbell_hook();
        // SAFETY: doorbell offsets computed from CAP.DSTRD for a granted qid
        // lie inside BAR0, which `ctrl` (kept alive by this queue) maps;
        // shadow slots are inside the controller's shadow pages.
        let (sq_db, cq_db) = unsafe {
            (
                Doorbell::new(
                    ctrl.link.bar.0,
                    regs::sq_tail_doorbell(qid, dstrd),
                    sq_shadow,
                    false,
                    hook.clone(),
                ),
                Doorbell::new(
                    ctrl.link.bar.0,
                    regs::cq_head_doorbell(qid, dstrd),
                    cq_shadow,
                    false,
                    hook,
                ),
            )
        };
        let irq = match opts.wait.wants_interrupt() {
            true => Some(ctrl.queue_irq(qid).map_err(none_left)?),
            false => None,
        };
        let cq = CompQueue::new(cq_mem, entries, cq_db);
        let sq = SubQueue::new(sq_mem, entries, sq_db);

        let seen_state = match ctrl.create_io_queues(
            qid,
            entries,
            cq.region().iova().raw(),
            sq.region().iova().raw(),
            irq.as_ref().map(|i| i.vector),
        ) {
            Ok(s) => s,
            Err((e, false)) => return Err((e, false)),
            Err((e, true)) => {
                // The controller may have the queues on these rings.
                let bytes = sq.region().len() + cq.region().len();
                log::error!("queue {qid}: creating the queues failed ({e}) and they may exist on the controller; leaking their {bytes}-byte rings");
                ctrl.note_leak(bytes as u64);
                std::mem::forget(sq);
                std::mem::forget(cq);
                return Err((e, true));
            }
        };

        // Sorted by NSID (as the controller keeps them): NSIDs may be
        // sparse (any value up to FFFFFFFEh), so no table indexed by NSID.
        let ns: Vec<(u32, NsGeom)> = ctrl
            .namespaces()
            .iter()
            .map(|n| {
                let metadata = n.identify.metadata_size() > 0;
                (
                    n.id,
                    NsGeom {
                        nsze: n.nsze,
                        lba_shift: n.lba_shift,
                        metadata,
                        // At most the namespace's size too: then `nlb <=
                        // nsze` on the hot path, whose range check
                        // subtracts without a wrap (a larger count is out
                        // of range, which the cold path says).
                        unsplit: if metadata {
                            0
                        } else {
                            unsplit_blocks(max_xfer, n.lba_shift)
                                .min(n.nsze.min(u64::from(u32::MAX)) as u32)
                        },
                    },
                )
            })
            .collect();
        let mut eng = Engine::new(
            opts.depth,
            opts.max_completions_per_poll,
            max_xfer,
            opts.io_timeout,
            opts.timeout_policy,
            opts.blocking_timeout,
            seen_state,
        );
        eng.wait = crate::core::qpair::wait::Waiter::of(opts.wait, irq);
        Ok(QueuePair {
            sq: ManuallyDrop::new(sq),
            cq: ManuallyDrop::new(cq),
            eng,
            prp: PrpLists {
                ptr: prp_mem.as_ptr().cast(),
                iova: prp_mem.iova().raw(),
                pages: prp_pages,
                max_xfer,
            },
            first_ns: ns.first().copied().unwrap_or((
                0,
                NsGeom {
                    nsze: 0,
                    lba_shift: 0,
                    metadata: false,
                    unsplit: 0,
                },
            )),
            ns: ns.into_boxed_slice(),
            cq_head_batch,
            cq_head_after_sq,
            oncs: ctrl.identify().oncs,
            space_key: B::space_key(&space),
            space,
            qid,
            teardown: Teardown::Live,
            prp_mem: ManuallyDrop::new(prp_mem),
            ctrl: Arc::clone(ctrl),
            _not_sync: PhantomData,
        })
    }
}

/// The most blocks of `1 << lba_shift` bytes one command carries without
/// a split under a `max_xfer`-byte limit: the largest `nlb` with
/// `nlb <= MAX_NLB` and `nlb << lba_shift <= max_xfer`.
fn unsplit_blocks(max_xfer: u64, lba_shift: u32) -> u32 {
    let by_bytes = max_xfer.checked_shr(lba_shift).unwrap_or(0);
    by_bytes.min(u64::from(MAX_NLB)) as u32
}

/// Consumed CQ entries a queue pair leaves unreleased before it writes the
/// CQ head doorbell, at any depth (rings permitting, see [`ring_entries`]).
///
/// A polled CQ's head tells the controller only which entries it may post
/// into again, so the controller needs it no sooner than the ring could
/// fill. The batch was `depth / 4` (at least 1), which at QD1 wrote the
/// head after every completion: one more MMIO store per I/O, where a
/// 32-entry batch writes one per 32. The cost is ring memory
/// only: 32 more entries of the SQ (64 B each) and the CQ (16 B each).
pub(super) const CQ_HEAD_BATCH: u16 = 32;

/// Ring sizes and CQ head policy of a queue pair (see [`ring_entries`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rings {
    entries: u16,
    cq_head_batch: u16,
    cq_head_after_sq: bool,
}

/// Ring entries and CQ head policy for `depth` commands, `asked` entries
/// (0: automatic) and a controller allowing `mqes` entries (CAP.MQES + 1).
///
/// The controller finds the CQ full when every entry but one is posted and
/// not released. Released lags consumed by fewer than `batch` entries after
/// every poll, and consumed-or-not, at most `depth` commands are
/// outstanding: `entries >= depth + batch` keeps one entry free for every
/// command the controller may fetch.
///
/// Writing a poll's head only at the next ring (after the SQ tail, so a
/// command resubmitted from what the poll reaped reaches the controller
/// first) leaves up to `batch - 1` plus everything that poll consumed, at
/// most `depth`, unreleased while the application queues and rings the
/// commands that replace them: `entries >= 2 * depth + batch` keeps the
/// same free entry, and only then is the head written after the SQ tail.
fn ring_entries(depth: u16, asked: u16, mqes: u32) -> Result<Rings> {
    let most = mqes.min(u32::from(u16::MAX)) as u16;
    if depth == 0 || depth > MAX_DEPTH {
        return Err(Error::InvalidOption(format!(
            "queue depth {depth} is outside 1..={MAX_DEPTH}"
        )));
    }
    if u32::from(depth) + 1 > mqes {
        return Err(Error::InvalidOption(format!(
            "queue depth {depth} needs {} ring entries but the controller supports at most {mqes} (CAP.MQES); use depth <= {}",
            u32::from(depth) + 1,
            mqes - 1
        )));
    }
    let want = CQ_HEAD_BATCH;
    // Room for the head after the SQ tail (a smaller batch never makes
    // room: with fewer entries it is `entries - depth`, short by `depth`).
    let roomy = 2 * u32::from(depth) + u32::from(want);
    let entries = match asked {
        0 => {
            if roomy <= u32::from(most) {
                roomy as u16
            } else {
                depth.saturating_add(want).min(most)
            }
        }
        n if n <= depth || n > most => {
            return Err(Error::InvalidOption(format!(
                "{n} I/O queue entries for queue depth {depth}: must be {}..={most} (depth + 1 up to CAP.MQES + 1)",
                u32::from(depth) + 1
            )))
        }
        n => n,
    };
    Ok(Rings {
        entries,
        cq_head_batch: want.min(entries - depth),
        cq_head_after_sq: u32::from(entries) >= roomy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring sizes and the CQ head batch, their bounds.
    #[test]
    fn ring_entries_leave_room_for_the_cq_head_batch() {
        let r = |d, a, m| {
            let r = ring_entries(d, a, m).unwrap();
            (r.entries, r.cq_head_batch, r.cq_head_after_sq)
        };
        // Automatic: 2 * depth + batch (the head written after the SQ
        // tail), the batch 32 at every depth.
        assert_eq!(r(1, 0, 1024), (34, 32, true));
        assert_eq!(r(16, 0, 1024), (64, 32, true));
        assert_eq!(r(128, 0, 1024), (288, 32, true));
        // A small MQES: the batch shrinks to what is left over the depth.
        assert_eq!(r(1, 0, 16), (16, 15, false));
        // Where MQES has no room for that: depth + batch, the head written
        // by the poll; the batch shrinks to what fits (at least 1).
        assert_eq!(r(500, 0, 1024), (532, 32, false));
        assert_eq!(r(1000, 0, 1024), (1024, 24, false));
        assert_eq!(r(1023, 0, 1024), (1024, 1, false));
        // Asked for: the batch fits in what is left over the depth; the
        // head after the SQ tail only with room for twice the depth.
        assert_eq!(r(128, 129, 1024), (129, 1, false));
        assert_eq!(r(128, 140, 1024), (140, 12, false));
        assert_eq!(r(128, 287, 1024), (287, 32, false));
        assert_eq!(r(128, 288, 1024), (288, 32, true));
        assert_eq!(r(128, 1024, 1024), (1024, 32, true));
        assert_eq!(r(1, 2, 1024), (2, 1, false));
        // Bounds: more than the depth, at most MQES + 1, a depth that fits.
        for (depth, asked, mqes) in [
            (128, 128, 1024),
            (128, 64, 1024),
            (128, 1025, 1024),
            (1024, 0, 1024),
            (0, 0, 1024),
            (4097, 0, 65536),
        ] {
            assert!(
                matches!(
                    ring_entries(depth, asked, mqes),
                    Err(Error::InvalidOption(_))
                ),
                "depth {depth}, {asked} entries, MQES+1 {mqes}"
            );
        }
    }
}
