//! mcqio targets: the in-process fake controller (`fake`, `fake:null`) and a
//! real controller through VFIO (`vfio:<BDF>`), both driven by the engine's
//! [`QueuePair`] — one per job, created on the job's thread.
//!
//! Each job's buffers are one DMA region allocated and mapped once
//! (premapped mode) and cut into one [`SlotBuf`] per slot; the job queue is
//! the transport-independent [`BlockJobQueue`] (`crate::slots`), shared with
//! UFS.

use std::ptr::NonNull;
use std::sync::Arc;

use mcqio::{Controller, ControllerOptions, QpairOptions, QueuePair, SubmitErrorKind};
use mcqio_fixtures::{FakeConfig, FakeController, Fault, NamespaceConfig};
use mcqio_open::{Backing, CtrlOptions, Device, Fake};
use mcqio_vfio::{
    AppBuffer, DmaDir, DmaMapper, DmaMode as VfioDmaMode, IoBuffer, IommuStats, LazyConfig, Mapped,
    MapperConfig, OpenOptions as VfioOpenOptions, QueueMapper, Returned,
};

use super::{CtrlInfo, FakeThread, Namespace, OpenPlan};
use crate::queue::{Failure, IoReq, IoStatus, JobQueue, PushError, QueueError};
use crate::slots::{BlockJobQueue, SlotBuf, SlotBuffers};
use crate::spec::{DeviceKind, DeviceSpec};
use crate::workload::Op;

/// The most I/O queue pairs the fake offers when `qpairs=` does not say:
/// one per job up to this many (a controller with more is rare; NVMe allows
/// 65535).
pub const FAKE_MAX_QPAIRS: u16 = 256;

/// The I/O queue pairs the fake of `spec` offers to a run of `jobs` jobs.
pub fn fake_queue_pairs(spec: &DeviceSpec, jobs: usize) -> u16 {
    spec.opts
        .qpairs
        .unwrap_or(jobs.clamp(1, FAKE_MAX_QPAIRS as usize) as u16)
}

/// A controller driven by the engine.
pub struct NvmeTarget {
    ctrl: Arc<Controller>,
    fake: Option<Arc<FakeController>>,
    info: CtrlInfo,
    /// I/O queue entries per queue pair (0: the engine's choice).
    queue_entries: u16,
    /// How its queue pairs wait (`--wait`).
    wait: mcqio::WaitPolicy,
}

impl std::fmt::Debug for NvmeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeTarget")
            .field("describe", &self.info.describe)
            .finish_non_exhaustive()
    }
}

impl NvmeTarget {
    /// Open the device `spec` names (`fake…` or `vfio:…`).
    pub fn open(spec: &DeviceSpec, plan: &OpenPlan) -> Result<Self, String> {
        let jobs = plan.jobs.max(1);
        let mut notes = Vec::new();
        // Job core and the fake's device-thread core (threaded fakes only).
        let mut cores = None;
        let (backing, describe) = match &spec.kind {
            DeviceKind::Fake { null } => {
                let o = &spec.opts;
                // The device itself comes from the shared defaults; the run
                // adds queue pairs, queue sizes, MDTS and the device thread.
                let base = spec
                    .fake_config()
                    .ok_or_else(|| format!("{} is not a fake", spec.label()))?;
                let (size, lbads) = match base.namespaces.first() {
                    Some(NamespaceConfig::Ram {
                        size_bytes,
                        lba_size,
                    })
                    | Some(NamespaceConfig::Null {
                        size_bytes,
                        lba_size,
                    }) => (*size_bytes, *lba_size),
                    None => return Err("the fake has no namespace".into()),
                };
                let ns = base.namespaces.len();
                let thread = FakeThread::place(o.core, o.sync == Some(true), plan, &mut notes);
                cores = thread.cores;
                let qpairs = fake_queue_pairs(spec, jobs);
                let cfg = FakeConfig {
                    io_queue_pairs: qpairs,
                    mqes: (plan.depth.clamp(1023, 4095)) as u16,
                    exec: thread.exec(),
                    seed: plan.seed,
                    ..base
                };
                // Room for the deepest queue the engine makes (depth + 1
                // entries; CAP.MQES is 0-based), so -q up to the engine's
                // limit works on the fake.
                let cfg = FakeConfig {
                    mqes: plan
                        .depth
                        .max(usize::from(plan.io_queue_size.unwrap_or(0)))
                        .clamp(1023, mcqio::nvme::pcie::qpair::MAX_DEPTH as usize)
                        as u16,
                    ..cfg
                };
                let d = format!(
                    "mcqio engine on the fake controller ({}, {} × {}, {lbads} B blocks, device thread on {})",
                    if *null { "null namespaces" } else { "RAM namespaces" },
                    crate::report::count_of(ns, "namespace"),
                    crate::report::bytes_text(size),
                    thread.describe()
                );
                (Backing::FakeNvme(cfg), Some(d))
            }
            DeviceKind::Vfio { bdf } => {
                // What the run will pin, for the up-front RLIMIT_MEMLOCK check:
                // per job its buffers, a PRP page per slot, the rings; plus
                // the admin queue and identify pages.
                let io = plan.io_size.div_ceil(4096) * 4096;
                let per_job = plan.depth as u64 * (io + 4096) + (1 << 20);
                let budget = jobs as u64 * per_job + (2 << 20);
                let options = VfioOpenOptions {
                    dma_budget: budget,
                    ..spec.vfio_options()
                };
                let b = Backing::Vfio {
                    bdf: bdf.clone(),
                    options,
                };
                (b, None)
            }
            _ => return Err(format!("{} is not an NVMe device spec", spec.label())),
        };
        let attached = backing.attach().map_err(|e| e.why())?;
        let fake = match &attached.fake {
            Some(Fake::Nvme(f)) => Some(f.clone()),
            _ => None,
        };
        if let Some(fake) = &fake {
            // Armed before the controller is brought up, so the bring-up
            // and the run see the faults they always did.
            if let Some(p) = spec.opts.corrupt {
                fake.faults().set_probability(Fault::CorruptReadData, p);
            }
            if let Some(p) = spec.opts.error {
                // Generic status 0x04, Data Transfer Error, do not retry.
                let fault = Fault::Status {
                    sct: 0,
                    sc: 0x04,
                    dnr: true,
                };
                fake.faults().set_probability(fault, p);
            }
        }
        let describe = describe
            .unwrap_or_else(|| format!("mcqio engine on {} (VFIO)", attached.backend.name()));
        let want_queues = spec.opts.qpairs.map_or(jobs, usize::from);
        let opts = CtrlOptions {
            nvme: ControllerOptions {
                io_queues: want_queues.min(u16::MAX as usize - 1) as u16,
                max_transfer: plan.io_size.max(4096),
                shadow_doorbells: spec.opts.shadow.unwrap_or(false),
                ..ControllerOptions::default()
            },
            ..CtrlOptions::default()
        };
        let Device::Nvme(ctrl) = attached.open(&opts).map_err(|e| e.why())?.device else {
            return Err(format!("{} is not an NVMe controller", spec.label()));
        };
        let namespaces: Vec<Namespace> = ctrl
            .namespaces()
            .iter()
            .map(|n| Namespace {
                nsid: n.id,
                blocks: n.nsze,
            })
            .collect();
        let Some(first) = ctrl.namespaces().first() else {
            return Err("the controller has no active namespace".into());
        };
        let lbads = first.lba_size as u32;
        if ctrl
            .namespaces()
            .iter()
            .any(|n| n.lba_size != first.lba_size)
        {
            notes
                .push("namespaces have different block sizes; I/O sizes follow namespace 1".into());
        }
        Ok(NvmeTarget {
            ctrl,
            fake,
            queue_entries: plan.io_queue_size.unwrap_or(0),
            wait: plan.wait,
            info: CtrlInfo {
                namespaces,
                lbads,
                describe,
                notes,
                cores,
            },
        })
    }

    /// I/O queue pairs the controller granted.
    pub fn granted_io_queues(&self) -> usize {
        self.ctrl.granted_io_queues()
    }

    /// What the run and the report need to know.
    pub fn info(&self) -> &CtrlInfo {
        &self.info
    }

    /// Remarks for the report, with what the fake injected so far.
    pub fn notes(&self) -> Vec<String> {
        self.info
            .notes_with(self.fake.as_ref().map(|f| f.faults().counts()))
    }

    /// The IOMMU counters of the controller's DMA space.
    pub fn iommu_stats(&self) -> IommuStats {
        self.ctrl.dma().iommu().counters().snapshot()
    }

    /// Queue-pair depth for `depth` I/Os of `io` bytes: the engine splits
    /// a transfer above the controller's per-command limit into child
    /// commands, one queue slot each. Capped by what the controller allows
    /// (full slots then hold back submissions), never below `depth`.
    fn qpair_depth(&self, depth: usize, io: usize) -> u16 {
        let children = (io as u64).div_ceil(self.ctrl.max_transfer().max(1)).max(1);
        let most = (self.ctrl.cap().max_queue_entries() as usize)
            .saturating_sub(1)
            .min(usize::from(mcqio::nvme::pcie::qpair::MAX_DEPTH));
        depth
            .saturating_mul(children as usize)
            .min(most)
            .max(depth)
            .min(u16::MAX as usize) as u16
    }

    /// A queue pair for `nsid` with `depth` slots of `buf_len` bytes.
    pub fn queue(&self, nsid: u32, depth: usize, buf_len: usize) -> Result<NvmeQueue, String> {
        let qp = self
            .ctrl
            .create_qpair_for::<SlotBuf>(QpairOptions {
                depth: self.qpair_depth(depth, buf_len),
                queue_entries: self.queue_entries,
                wait: self.wait,
                ..QpairOptions::default()
            })
            .map_err(|e| e.to_string())?;
        let mem = SlotBuffers::alloc(self.ctrl.dma(), depth, buf_len)?;
        Ok(BlockJobQueue::new(qp, nsid, mem))
    }
}

/// One job's NVMe queue pair and its premapped buffers.
pub type NvmeQueue = BlockJobQueue<QueuePair<SlotBuf>>;

/// One job's queue pair in `--dma strict` or `--dma lazy` mode: ordinary
/// application buffers, mapped per I/O through a [`QueueMapper`].
///
/// Buffers are a pool of `depth` (strict) or `depth + batch` (lazy)
/// [`AppBuffer`]s: a lazy flush queue holds up to `batch - 1` released
/// buffers on top of the in-flight ones, so a free slot always finds a
/// buffer. A completion is delivered at its CQE; its buffer rejoins the pool
/// when the mapper hands it back (after the unmap that covers it returned).
///
/// A pool buffer is not tied to a slot (a released one may wait in the flush
/// queue while its slot is reused), so for `--verify` each slot gets a
/// staging buffer the job reads and writes: a write's data is copied into
/// the pool buffer before it is mapped, a read's data out of it at the
/// completion, before it is released. The copies happen only when verifying.
pub struct MappedQueue {
    // Field order: the queue pair (holding in-flight mappings) drops first,
    // then the mapper (flushing what it queued).
    qp: QueuePair<Mapped>,
    mapper: QueueMapper,
    nsid: u32,
    lbads: u32,
    depth: usize,
    buf_len: usize,
    free: Vec<IoBuffer>,
    returned: Vec<Returned>,
    /// `--verify` only: one staging buffer per slot (8-aligned words).
    staging: Vec<Box<[u64]>>,
    /// `--verify` only: host address of the pool buffer each slot's I/O uses.
    host: Vec<Option<NonNull<u8>>>,
}

impl NvmeTarget {
    /// A queue pair for `nsid` mapping buffers per I/O in `mode`.
    pub fn mapped_queue(
        &self,
        nsid: u32,
        depth: usize,
        buf_len: usize,
        mode: VfioDmaMode,
        batch: Option<usize>,
        verify: bool,
    ) -> Result<MappedQueue, String> {
        let mut cfg = MapperConfig::with_mode(mode);
        if let Some(b) = batch {
            cfg.lazy = LazyConfig::with_batch(b.max(1));
        }
        let queued = if mode == VfioDmaMode::Lazy {
            cfg.lazy.batch
        } else {
            0
        };
        let pages = buf_len.div_ceil(4096) as u64 * 4096;
        cfg.window_len = cfg.window_len.max((depth + queued + 1) as u64 * pages * 2);
        let mapper = QueueMapper::new(self.ctrl.dma(), &cfg)
            .map_err(|e| format!("creating the {mode} DMA mapper: {e}"))?;
        let qp = self
            .ctrl
            .create_qpair_for::<Mapped>(QpairOptions {
                depth: self.qpair_depth(depth, buf_len),
                queue_entries: self.queue_entries,
                ..QpairOptions::default()
            })
            .map_err(|e| e.to_string())?;
        let free = (0..depth + queued)
            .map(|_| AppBuffer::for_space(self.ctrl.dma(), buf_len).map(IoBuffer::App))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("allocating {} application buffers: {e}", depth + queued))?;
        Ok(MappedQueue {
            qp,
            mapper,
            nsid,
            lbads: self.info.lbads,
            depth,
            buf_len,
            free,
            returned: Vec::with_capacity(depth + queued),
            staging: if verify {
                (0..depth)
                    .map(|_| vec![0u64; buf_len.div_ceil(8)].into_boxed_slice())
                    .collect()
            } else {
                Vec::new()
            },
            host: if verify {
                vec![None; depth]
            } else {
                Vec::new()
            },
        })
    }
}

impl MappedQueue {
    fn take_returned(&mut self) {
        self.free.extend(self.returned.drain(..).map(|r| r.buf));
    }
}

impl JobQueue for MappedQueue {
    fn depth(&self) -> usize {
        self.depth.min(self.qp.depth())
    }

    fn buffer_len(&self) -> usize {
        self.buf_len
    }

    /// The slot's staging buffer with `--verify` (see the type's docs);
    /// without it there is no per-slot buffer and nothing may touch this.
    fn buffer(&self, slot: usize) -> NonNull<u8> {
        match self.staging.get(slot) {
            Some(b) => NonNull::new(b.as_ptr() as *mut u8).expect("a boxed slice is not null"),
            None => NonNull::dangling(),
        }
    }

    #[inline]
    fn push(&mut self, slot: usize, req: IoReq) -> Result<(), PushError> {
        let Some(buf) = self.free.pop() else {
            return Err(PushError::Full);
        };
        let len = req.nlb as usize * self.lbads as usize;
        let dir = match req.op {
            Op::Read => DmaDir::FromDevice,
            Op::Write => DmaDir::ToDevice,
        };
        if let Some(stage) = self.staging.get(slot) {
            let dst = buf.as_ptr();
            if req.op == Op::Write {
                // SAFETY: `buf` is not mapped (it came from the free list)
                // and holds buf_len >= len bytes, as does the slot's staging
                // buffer; the two are distinct allocations.
                unsafe {
                    std::ptr::copy_nonoverlapping(stage.as_ptr().cast::<u8>(), dst.as_ptr(), len)
                };
            }
            self.host[slot] = Some(dst);
        }
        let m = match self.mapper.map(buf, len, dir, slot as u64) {
            Ok(m) => m,
            Err(f) => {
                let why = f.error.to_string();
                self.free.push(f.buf);
                return Err(PushError::Rejected(format!("mapping failed: {why}")));
            }
        };
        let r = match req.op {
            Op::Read => self.qp.read(self.nsid, req.slba, req.nlb, m, slot as u64),
            Op::Write => self.qp.write(self.nsid, req.slba, req.nlb, m, slot as u64),
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                let kind = e.kind;
                let released = self.mapper.release(e.into_buf(), &mut self.returned);
                self.take_returned();
                if let Err(u) = released {
                    return Err(PushError::Rejected(format!(
                        "unmapping a rejected buffer failed: {u}"
                    )));
                }
                Err(match kind {
                    SubmitErrorKind::QueueFull => PushError::Full,
                    k => PushError::Rejected(k.to_string()),
                })
            }
        }
    }

    #[inline]
    fn submit(&mut self, _inflight: usize) -> Result<(), QueueError> {
        self.qp.submit();
        Ok(())
    }

    #[inline]
    fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
        let mapper = &mut self.mapper;
        let returned = &mut self.returned;
        let staging = &mut self.staging;
        let host = &self.host;
        let mut unmap_err = None;
        let n = self
            .qp
            .poll(usize::MAX, |c| {
                let slot = c.tag as usize;
                let status = match c.result {
                    Ok(()) => IoStatus::Ok,
                    Err(mcqio::IoError::Nvme(s)) => IoStatus::Failed(Failure::Nvme(s)),
                    Err(e) => IoStatus::Failed(Failure::Host(e)),
                };
                if let Some(m) = c.buf {
                    if let (Some(stage), Some(Some(src))) = (staging.get_mut(slot), host.get(slot))
                    {
                        let len = m.transfer_len().min(stage.len() * 8);
                        // SAFETY: the command completed, so the device no
                        // longer writes the buffer; `m` still owns it (it is
                        // released below), `src` is its host address and it
                        // holds at least the transfer length; the staging
                        // buffer is a distinct allocation of buf_len bytes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                src.as_ptr(),
                                stage.as_mut_ptr().cast::<u8>(),
                                len,
                            )
                        };
                    }
                    if let Err(e) = mapper.release(m, returned) {
                        unmap_err.get_or_insert(e);
                    }
                }
                done(slot, status);
            })
            .map_err(|e| QueueError(e.to_string()))?;
        if let Err(e) = mapper.poll(returned) {
            unmap_err.get_or_insert(e);
        }
        self.take_returned();
        match unmap_err {
            Some(e) => Err(QueueError(format!("unmap failed: {e}"))),
            None => Ok(n),
        }
    }

    fn counters(&self) -> Option<mcqio::QueueCounters> {
        Some(self.qp.counters())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// When the controller refuses to delete the queue, a
    /// command in flight keeps its slot of the region; the region must stay
    /// mapped (the device may still write into it) after the queue drops.
    #[test]
    fn refused_queue_deletion_leaks_the_slot_region() {
        let spec: DeviceSpec = "fake,sync=1".parse().expect("spec");
        let plan = OpenPlan {
            jobs: 1,
            depth: 4,
            io_queue_size: None,
            io_size: 4096,
            writes: false,
            job_cores: Vec::new(),
            seed: 1,
            dma: crate::queue::DmaMode::Premapped,
            hpb: None,
            wait: mcqio::WaitPolicy::Poll,
        };
        let t = NvmeTarget::open(&spec, &plan).expect("fake target");
        let fake = t.fake.clone().expect("a fake");
        let mut q = t.queue(1, 4, 4096).expect("queue");
        fake.faults().inject_next(
            Some(q.qp.qid()),
            None,
            Fault::Delay(Duration::from_secs(3600)),
        );
        let req = IoReq {
            op: Op::Read,
            slba: 0,
            nlb: 4096 / t.info().lbads,
        };
        q.push(0, req).expect("push");
        q.submit(1).expect("submit");
        assert_eq!(fake.faults().pending(), 0, "the command was fetched");
        fake.faults().inject_next(
            Some(0),
            Some(mcqio::nvme::spec::opcodes::admin::DELETE_IO_SQ),
            Fault::Status {
                sct: 1,
                sc: 0x01,
                dnr: true,
            },
        );
        let mapped = fake.iommu().mapping_count();
        drop(q);
        assert_eq!(
            fake.iommu().mapping_count(),
            mapped,
            "the slot region (and the rings) must stay mapped"
        );
    }
}
