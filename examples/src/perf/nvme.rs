//! mcqio targets: the in-process fake controller (`fake`, `fake:null`) and a
//! real controller through VFIO (`vfio:<BDF>`), both driven by the engine's
//! [`QueuePair`] — one per job, created on the job's thread.
//!
//! Each job's buffers are one DMA region allocated and mapped once
//! (premapped mode), cut into one [`DmaBuf`] per slot. A buffer moves into
//! the queue pair at submission and comes back in the completion, where the
//! job puts it back in its slot; nothing is allocated or mapped per I/O.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use mcqio::{Controller, ControllerOptions, DmaBuf, QpairOptions, QueuePair, SubmitErrorKind};
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, Fault, NamespaceConfig};
use mcqio_vfio::{Backend, DmaDir, IommuStats, VfioBackend};

use crate::queue::{Failure, IoReq, IoStatus, JobQueue, PushError, QueueError};
use crate::spec::{DeviceKind, DeviceSpec};
use crate::target::{Namespace, OpenPlan};
use crate::workload::Op;

/// Default namespace size of `fake` (RAM, allocated lazily by the OS).
pub const FAKE_RAM_SIZE: u64 = 64 << 20;
/// Default namespace size of `fake:null` (advertised only).
pub const FAKE_NULL_SIZE: u64 = 1 << 40;
/// Default logical block size of the fake.
pub const FAKE_LBADS: u32 = 4096;

/// A controller driven by the engine.
pub struct NvmeTarget {
    ctrl: Arc<Controller>,
    fake: Option<Arc<FakeController>>,
    namespaces: Vec<Namespace>,
    lbads: u32,
    describe: String,
    notes: Vec<String>,
}

impl std::fmt::Debug for NvmeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeTarget")
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

fn pages_log2(bytes: u64) -> u8 {
    let pages = bytes.div_ceil(4096).max(1);
    pages.next_power_of_two().trailing_zeros() as u8
}

impl NvmeTarget {
    /// Open the device `spec` names (`fake…` or `vfio:…`).
    pub fn open(spec: &DeviceSpec, plan: &OpenPlan) -> Result<Self, String> {
        let jobs = plan.jobs.max(1);
        let mut notes = Vec::new();
        let (backend, fake, describe): (Arc<dyn Backend>, _, String) = match &spec.kind {
            DeviceKind::Fake { null } => {
                let o = &spec.opts;
                let lbads = o.lbads.unwrap_or(FAKE_LBADS);
                let size = o
                    .size
                    .unwrap_or(if *null { FAKE_NULL_SIZE } else { FAKE_RAM_SIZE });
                let size = size / lbads as u64 * lbads as u64;
                if size == 0 {
                    return Err(format!("size must hold at least one {lbads}-byte block"));
                }
                let ns = o.ns.unwrap_or(1);
                let nscfg = |_| {
                    if *null {
                        NamespaceConfig::null(size, lbads)
                    } else {
                        NamespaceConfig::ram(size, lbads)
                    }
                };
                // Keep the device thread off the job cores, as hardware is.
                let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
                let pin = o
                    .core
                    .or_else(|| (0..ncpu).rev().find(|c| !plan.job_cores.contains(c)));
                let sync = o.sync == Some(true);
                if pin.is_none() && !sync {
                    notes.push(
                        "every core runs a job: the fake's device thread shares a core with a job"
                            .into(),
                    );
                }
                let qpairs = o.qpairs.unwrap_or(jobs.min(u16::MAX as usize - 1) as u16);
                let cfg = FakeConfig {
                    namespaces: (0..ns).map(nscfg).collect(),
                    io_queue_pairs: qpairs,
                    mqes: (plan.depth.clamp(1023, 4095)) as u16,
                    mdts: pages_log2(plan.io_size).max(5),
                    exec: if o.sync == Some(true) {
                        ExecMode::Sync
                    } else {
                        ExecMode::Threaded {
                            workers: 1,
                            pin_core: pin,
                        }
                    },
                    latency: o.latency.unwrap_or(Duration::ZERO),
                    seed: plan.seed,
                    ..FakeConfig::default()
                };
                let fake = FakeController::new(cfg).map_err(|e| e.to_string())?;
                if let Some(p) = o.corrupt {
                    fake.faults().set_probability(Fault::CorruptReadData, p);
                }
                let d = format!(
                    "mcqio engine on the fake controller ({}, {ns} ns x {size} B, {lbads} B blocks, device thread on {})",
                    if *null { "null namespaces" } else { "RAM namespaces" },
                    match (sync, pin) {
                        (true, _) => "none: synchronous in the doorbell store".to_string(),
                        (false, Some(c)) => format!("core {c}"),
                        (false, None) => "any core".to_string(),
                    }
                );
                (fake.clone() as Arc<dyn Backend>, Some(fake), d)
            }
            DeviceKind::Vfio { bdf } => {
                let b = VfioBackend::open(bdf).map_err(|e| e.to_string())?;
                let d = format!("mcqio engine on {} (VFIO)", b.name());
                (Arc::new(b) as Arc<dyn Backend>, None, d)
            }
            _ => return Err(format!("{} is not an NVMe device spec", spec.label())),
        };
        let want_queues = spec.opts.qpairs.map_or(jobs, usize::from);
        let opts = ControllerOptions {
            io_queues: want_queues.min(u16::MAX as usize - 1) as u16,
            max_transfer: plan.io_size.max(4096),
            ..ControllerOptions::default()
        };
        let ctrl = Controller::new(backend, opts).map_err(|e| e.to_string())?;
        if ctrl.granted_io_queues() < jobs {
            return Err(format!(
                "{} job(s) need {jobs} I/O queue pairs but the controller granted {}; use -j {} (queues are never shared)",
                jobs,
                ctrl.granted_io_queues(),
                ctrl.granted_io_queues()
            ));
        }
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
            namespaces,
            lbads,
            describe,
            notes,
        })
    }

    /// Logical block size.
    pub fn lbads(&self) -> u32 {
        self.lbads
    }

    /// Active namespaces.
    pub fn namespaces(&self) -> &[Namespace] {
        &self.namespaces
    }

    /// A one-line description.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Remarks for the report.
    pub fn notes(&self) -> Vec<String> {
        let mut n = self.notes.clone();
        if let Some(f) = &self.fake {
            let c = f.faults().counts();
            let corrupted: u64 = c.values().sum();
            if corrupted > 0 {
                n.push(format!("the fake injected {corrupted} fault(s): {c:?}"));
            }
        }
        n
    }

    /// The IOMMU counters of the controller's DMA space.
    pub fn iommu_stats(&self) -> IommuStats {
        self.ctrl.dma().iommu().counters().snapshot()
    }

    /// A queue pair for `nsid` with `depth` slots of `buf_len` bytes.
    pub fn queue(&self, nsid: u32, depth: usize, buf_len: usize) -> Result<NvmeQueue, String> {
        let qp = self
            .ctrl
            .create_qpair(QpairOptions {
                depth: depth.min(u16::MAX as usize) as u16,
                ..QpairOptions::default()
            })
            .map_err(|e| e.to_string())?;
        let region = DmaBuf::alloc(self.ctrl.dma(), depth * buf_len, DmaDir::Bidirectional)
            .map_err(|e| {
                format!(
                    "cannot allocate {} bytes of DMA buffers: {e}",
                    depth * buf_len
                )
            })?;
        let bufs = region.chunks(buf_len).map_err(|e| e.to_string())?;
        let ptrs = bufs.iter().map(|b| b.as_ptr()).collect();
        Ok(NvmeQueue {
            qp,
            nsid,
            bufs: bufs.into_iter().map(Some).collect(),
            ptrs,
            buf_len,
        })
    }
}

/// One job's queue pair and its premapped buffers.
pub struct NvmeQueue {
    qp: QueuePair<DmaBuf>,
    nsid: u32,
    /// Slot buffers; `None` while in flight.
    bufs: Vec<Option<DmaBuf>>,
    ptrs: Vec<NonNull<u8>>,
    buf_len: usize,
}

impl JobQueue for NvmeQueue {
    fn depth(&self) -> usize {
        self.bufs.len().min(self.qp.depth())
    }

    fn buffer_len(&self) -> usize {
        self.buf_len
    }

    #[inline]
    fn buffer(&self, slot: usize) -> NonNull<u8> {
        self.ptrs[slot]
    }

    #[inline]
    fn push(&mut self, slot: usize, req: IoReq) -> Result<(), PushError> {
        let Some(buf) = self.bufs[slot].take() else {
            return Err(PushError::Rejected(format!(
                "slot {slot} is already in flight"
            )));
        };
        let r = match req.op {
            Op::Read => self.qp.read(self.nsid, req.slba, req.nlb, buf, slot as u64),
            Op::Write => self
                .qp
                .write(self.nsid, req.slba, req.nlb, buf, slot as u64),
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                let kind = e.kind;
                self.bufs[slot] = Some(e.into_buf());
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
        let bufs = &mut self.bufs;
        self.qp
            .poll(usize::MAX, |c| {
                let slot = c.tag as usize;
                bufs[slot] = c.buf;
                let status = match c.result {
                    Ok(()) => IoStatus::Ok,
                    Err(mcqio::IoError::Nvme(s)) => IoStatus::Failed(Failure::Nvme(s)),
                    Err(e) => IoStatus::Failed(Failure::Host(e)),
                };
                done(slot, status);
            })
            .map_err(|e| QueueError(e.to_string()))
    }
}
