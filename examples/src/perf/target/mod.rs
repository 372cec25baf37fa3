//! A device opened for a run, shared by its jobs: the one place in
//! mcqio-perf that names a wire.
//!
//! [`Target::run_jobs`] holds the one `match` on the device kind: it builds the
//! queues of a thread's jobs, of the concrete type, and calls the generic job loop
//! with them. Each wire's target is a file here — `nvme` (the fake and
//! `vfio:` NVMe), `ufs` (the fake UFS and `vfio:` UFS), `tcp` (NVMe/TCP) —
//! and the io_uring baseline is `crate::uring`; the run, the job loop and
//! the report see only [`Target`], [`JobQueue`] and the neutral slot
//! queue (`crate::slots`).

mod nvme;
mod tcp;
mod ufs;

use std::sync::Arc;

use mcqio::core::block::BlockQueue;

use crate::clock::Clock;
use crate::error::PerfError;
use crate::job::{self, JobResult, JobSpec, Shared};
use crate::queue::{DmaMode, JobQueue};
use crate::slots::{BlockJobQueue, SlotBuf};
use crate::spec::{DeviceKind, DeviceSpec};
use crate::uring::UringTarget;
use nvme::NvmeTarget;
use tcp::TcpTarget;
use ufs::{UfsOpenError, UfsTarget};

/// The deepest queue `-q` may ask for: the engine's NVMe queue-pair
/// limit, the deepest of the wires (UFS and NVMe/TCP queues take what
/// their controller offers and answer busy beyond it).
pub const MAX_DEPTH: u16 = mcqio::nvme::pcie::qpair::MAX_DEPTH;

/// What an NVMe or UFS controller target tells the run and the report,
/// kept the same way for both.
pub struct CtrlInfo {
    /// Namespaces (UFS: logical units, `nsid` = LUN + 1).
    pub namespaces: Vec<Namespace>,
    /// Logical block size in bytes.
    pub lbads: u32,
    /// A one-line description.
    pub describe: String,
    /// Remarks for the report, fixed at open.
    pub notes: Vec<String>,
    /// The first job's core and the fake's device-thread core, when the
    /// device is a threaded fake pinned to a core.
    pub cores: Option<(usize, usize)>,
}

/// Where a fake's device thread runs (the same rules for the NVMe and the
/// UFS fake): pinned to `core=` if given, else to the highest core no job
/// uses (kept off the job cores, as hardware is); or nowhere with `sync=1`.
#[derive(Clone, Copy, Debug)]
pub struct FakeThread {
    /// `sync=1`: the device runs in the doorbell store, on the job's thread.
    pub sync: bool,
    /// The core the device thread is pinned to.
    pub pin: Option<usize>,
    /// The first job's core and `pin`, when both are known and not `sync`.
    pub cores: Option<(usize, usize)>,
}

impl FakeThread {
    /// Place the device thread for `plan`; the report's notes about it go
    /// to `notes` (including how far its core is from the first job's).
    pub fn place(
        core: Option<usize>,
        sync: bool,
        plan: &OpenPlan,
        notes: &mut Vec<String>,
    ) -> Self {
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pin = core.or_else(|| (0..ncpu).rev().find(|c| !plan.job_cores.contains(c)));
        if sync {
            return FakeThread {
                sync,
                pin,
                cores: None,
            };
        }
        if pin.is_none() {
            notes.push(
                "every core runs a job: the fake's device thread shares a core with a job".into(),
            );
        }
        let cores = plan.job_cores.first().copied().zip(pin);
        notes.extend(cores.and_then(crate::corelat::note_before));
        notes.push(
            "the fake's device thread busy-polls its own core, doing in software what a controller does in hardware: \
             job-thread CPU is the host's cost, process CPU adds the device's"
                .into(),
        );
        FakeThread { sync, pin, cores }
    }

    /// The fake's execution mode.
    pub fn exec(&self) -> mcqio_fixtures::ExecMode {
        if self.sync {
            mcqio_fixtures::ExecMode::Sync
        } else {
            mcqio_fixtures::ExecMode::Threaded {
                workers: 1,
                pin_core: self.pin,
            }
        }
    }

    /// "device thread on …" for the description.
    pub fn describe(&self) -> String {
        match (self.sync, self.pin) {
            (true, _) => "none: synchronous in the doorbell store".to_string(),
            (false, Some(c)) => format!("core {c}"),
            (false, None) => "any core".to_string(),
        }
    }
}

impl CtrlInfo {
    /// The notes, plus what the fake injected so far (`counts`: its
    /// fault counts by kind; `None` for a real device).
    pub fn notes_with<K: std::fmt::Debug>(
        &self,
        counts: Option<std::collections::BTreeMap<K, u64>>,
    ) -> Vec<String> {
        let mut n = self.notes.clone();
        if let Some(c) = counts {
            let injected: u64 = c.values().sum();
            if injected > 0 {
                n.push(format!("the fake injected {injected} fault(s): {c:?}"));
            }
        }
        n
    }
}

/// A namespace the jobs can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace id (1-based).
    pub nsid: u32,
    /// Size in logical blocks.
    pub blocks: u64,
}

/// What opening a device needs to know about the run.
#[derive(Debug, Clone)]
pub struct OpenPlan {
    /// Jobs (queue pairs) that will run.
    pub jobs: usize,
    /// Queue depth per job.
    pub depth: usize,
    /// NVMe I/O queue entries (`None`: the engine's choice).
    pub io_queue_size: Option<u16>,
    /// Bytes per I/O.
    pub io_size: u64,
    /// Whether the workload writes.
    pub writes: bool,
    /// Cores the jobs are pinned to (a fake's device thread stays off them).
    pub job_cores: Vec<usize>,
    /// The run's seed (also seeds the fake's fault injection).
    pub seed: u64,
    /// The DMA buffer mode.
    pub dma: DmaMode,
    /// UFS HPB with this host map budget per LU (`None`: off).
    pub hpb: Option<u64>,
    /// How the engine's queue pairs wait (`--wait`).
    pub wait: mcqio::WaitPolicy,
}

/// An open device.
#[derive(Debug)]
pub enum Target {
    /// `uring:null` or `uring:<path>`.
    Uring(Arc<UringTarget>),
    /// `fake`, `fake:null` or `vfio:<BDF>` on NVMe: the mcqio engine.
    Nvme(NvmeTarget),
    /// `fake-ufs`, `fake-ufs:null` or `vfio:<BDF>` on UFS: the mcqio engine.
    Ufs(UfsTarget),
    /// `tcp:<addr>:<port>/<nqn>`: the mcqio engine over NVMe/TCP.
    Tcp(TcpTarget),
}

impl Target {
    /// Open the device a spec names.
    pub fn open(spec: &DeviceSpec, plan: &OpenPlan) -> Result<Target, PerfError> {
        match &spec.kind {
            DeviceKind::UringNull => Ok(Target::Uring(Arc::new(UringTarget::null()))),
            DeviceKind::UringFile { path } => Ok(Target::Uring(Arc::new(UringTarget::open(
                path,
                spec.opts.block_size,
                spec.opts.size,
                spec.opts.direct,
                plan.writes,
            )?))),
            DeviceKind::Tcp { .. } => {
                if plan.dma != DmaMode::Premapped {
                    return Err(PerfError::Usage(format!(
                        "--dma {} is not available on NVMe/TCP (`{}`): use --dma premapped",
                        plan.dma.name(),
                        spec.label()
                    )));
                }
                let jobs = plan.jobs.max(1);
                let t = TcpTarget::open(spec, plan)
                    .map_err(|e| PerfError::Device(format!("{}: {e}", spec.label())))?;
                if t.granted_io_queues() < jobs {
                    return Err(PerfError::QueueCount {
                        device: spec.label(),
                        jobs,
                        granted: t.granted_io_queues(),
                    });
                }
                Ok(Target::Tcp(t))
            }
            DeviceKind::FakeUfs { .. } | DeviceKind::Vfio { .. }
                if spec.is_ufs(&mcqio_vfio::SysRoots::default()) =>
            {
                if plan.dma != DmaMode::Premapped {
                    return Err(PerfError::Usage(format!(
                        "--dma {} is not available on UFS (`{}`): use --dma premapped",
                        plan.dma.name(),
                        spec.label()
                    )));
                }
                let jobs = plan.jobs.max(1);
                match UfsTarget::open(spec, plan) {
                    Ok(t) => Ok(Target::Ufs(t)),
                    Err(UfsOpenError::Queues { granted }) => Err(PerfError::QueueCount {
                        device: spec.label(),
                        jobs,
                        granted,
                    }),
                    Err(UfsOpenError::Other(e)) => {
                        Err(PerfError::Device(format!("{}: {e}", spec.label())))
                    }
                }
            }
            DeviceKind::FakeUfs { .. } => Err(PerfError::Device(format!(
                "{}: not a UFS device",
                spec.label()
            ))),
            DeviceKind::Fake { .. } | DeviceKind::Vfio { .. } => {
                let jobs = plan.jobs.max(1);
                if matches!(spec.kind, DeviceKind::Fake { .. }) {
                    // Known before building anything: say so instead of
                    // starting the jobs and failing one of them.
                    let offered = nvme::fake_queue_pairs(spec, jobs) as usize;
                    if offered < jobs {
                        return Err(PerfError::QueueCount {
                            device: spec.label(),
                            jobs,
                            granted: offered,
                        });
                    }
                }
                let t = NvmeTarget::open(spec, plan)
                    .map_err(|e| PerfError::Device(format!("{}: {e}", spec.label())))?;
                if t.granted_io_queues() < jobs {
                    return Err(PerfError::QueueCount {
                        device: spec.label(),
                        jobs,
                        granted: t.granted_io_queues(),
                    });
                }
                Ok(Target::Nvme(t))
            }
        }
    }

    /// Logical block size in bytes.
    pub fn lbads(&self) -> u32 {
        match self {
            Target::Uring(t) => t.lbads(),
            Target::Nvme(t) => t.info().lbads,
            Target::Ufs(t) => t.info().lbads,
            Target::Tcp(t) => t.info().lbads,
        }
    }

    /// Namespaces available to jobs.
    pub fn namespaces(&self) -> Vec<Namespace> {
        match self {
            Target::Uring(t) => vec![Namespace {
                nsid: 1,
                blocks: t.blocks(),
            }],
            Target::Nvme(t) => t.info().namespaces.clone(),
            Target::Ufs(t) => t.info().namespaces.clone(),
            Target::Tcp(t) => t.info().namespaces.clone(),
        }
    }

    /// One line on what is underneath.
    pub fn describe(&self) -> String {
        match self {
            Target::Uring(t) => t.describe(),
            Target::Nvme(t) => t.info().describe.clone(),
            Target::Ufs(t) => t.info().describe.clone(),
            Target::Tcp(t) => t.info().describe.clone(),
        }
    }

    /// The first job's core and the fake's device-thread core, when the
    /// device is a threaded fake pinned to a core.
    pub fn fake_cores(&self) -> Option<(usize, usize)> {
        match self {
            Target::Uring(_) | Target::Tcp(_) => None,
            Target::Nvme(t) => t.info().cores,
            Target::Ufs(t) => t.info().cores,
        }
    }

    /// Remarks for the report.
    pub fn notes(&self) -> Vec<String> {
        match self {
            Target::Uring(t) => t.notes().to_vec(),
            Target::Nvme(t) => t.notes(),
            Target::Ufs(t) => t.notes(),
            Target::Tcp(t) => t.info().notes.clone(),
        }
    }

    /// IOMMU counters, if the device sits behind an IOMMU.
    pub fn iommu_stats(&self) -> Option<mcqio_vfio::IommuStats> {
        match self {
            Target::Uring(_) | Target::Tcp(_) => None,
            Target::Nvme(t) => Some(t.iommu_stats()),
            Target::Ufs(t) => Some(t.iommu_stats()),
        }
    }

    /// HPB counters per LU (UFS with `--hpb`; empty otherwise).
    pub fn hpb_stats(&self) -> Vec<crate::report::HpbReport> {
        match self {
            Target::Ufs(t) => t.hpb_stats().iter().map(Into::into).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether jobs address logical units (UFS) rather than namespaces.
    pub fn is_ufs(&self) -> bool {
        matches!(self, Target::Ufs(_))
    }

    /// Build the queues of this thread's jobs on the calling thread (one
    /// per job: a thread that drives several namespaces has a queue pair
    /// for each) and run their loops. `ready` is called once set-up (and
    /// the verify prefill) is done or failed.
    pub fn run_jobs(
        &self,
        specs: &[JobSpec],
        shared: &Shared,
        clock: Clock,
        ready: impl FnOnce(Result<(), String>),
    ) -> Result<Vec<JobResult>, String> {
        let buf_len = |spec: &JobSpec| spec.nlb as usize * spec.lbads as usize;
        match self {
            Target::Uring(t) => start(
                specs
                    .iter()
                    .map(|spec| {
                        t.queue(spec.depth, buf_len(spec))
                            .map_err(|e| e.to_string())
                    })
                    .collect(),
                specs,
                shared,
                clock,
                ready,
            ),
            Target::Tcp(t) => start(
                specs
                    .iter()
                    .map(|s| t.queue(s.nsid, s.depth, buf_len(s)))
                    .collect(),
                specs,
                shared,
                clock,
                ready,
            ),
            Target::Ufs(t) => {
                // The legacy single-doorbell list, where the run has one, is
                // shared by every job; otherwise each job has an MCQ queue.
                let legacy: Option<Vec<Result<_, String>>> = specs
                    .iter()
                    .map(|s| t.shared_queue(s.nsid, s.depth, buf_len(s)))
                    .collect();
                match legacy {
                    Some(qs) => start(qs.into_iter().collect(), specs, shared, clock, ready),
                    None => start(
                        specs
                            .iter()
                            .map(|s| t.queue(s.nsid, s.depth, buf_len(s)))
                            .collect(),
                        specs,
                        shared,
                        clock,
                        ready,
                    ),
                }
            }
            Target::Nvme(t) => match specs.first().map_or(DmaMode::Premapped, |s| s.dma) {
                DmaMode::Premapped => start(
                    specs
                        .iter()
                        .map(|s| t.queue(s.nsid, s.depth, buf_len(s)))
                        .collect(),
                    specs,
                    shared,
                    clock,
                    ready,
                ),
                dma @ (DmaMode::Strict | DmaMode::Lazy) => {
                    let mode = if dma == DmaMode::Strict {
                        mcqio_vfio::DmaMode::Strict
                    } else {
                        mcqio_vfio::DmaMode::Lazy
                    };
                    start(
                        specs
                            .iter()
                            .map(|s| {
                                t.mapped_queue(
                                    s.nsid,
                                    s.depth,
                                    buf_len(s),
                                    mode,
                                    s.dma_batch,
                                    s.verify,
                                )
                            })
                            .collect(),
                        specs,
                        shared,
                        clock,
                        ready,
                    )
                }
            },
        }
    }
}

/// Code run on one of the engine's queue pairs with premapped slot
/// buffers, whatever its wire (`--minimal`): a closure generic over the
/// queue pair's type, which Rust closures cannot be, resolved statically.
pub trait OnSlotQueue {
    /// What the run returns.
    type Output;
    /// Run on `q`.
    fn run<Q: BlockQueue<Buf = SlotBuf>>(self, q: BlockJobQueue<Q>) -> Self::Output;
}

impl Target {
    /// Build one queue pair for `nsid` with `depth` slots of `buf_len`
    /// bytes on the calling thread and run `f` on it: the engine alone,
    /// without the job loop (`--minimal`).
    pub fn with_slot_queue<F: OnSlotQueue>(
        &self,
        nsid: u32,
        depth: usize,
        buf_len: usize,
        f: F,
    ) -> Result<F::Output, PerfError> {
        match self {
            Target::Nvme(t) => {
                let q = t.queue(nsid, depth, buf_len).map_err(PerfError::Device)?;
                Ok(f.run(q))
            }
            Target::Ufs(t) => {
                let q = t.queue(nsid, depth, buf_len).map_err(PerfError::Device)?;
                Ok(f.run(q))
            }
            Target::Uring(_) => Err(PerfError::Usage(
                "--minimal drives the mcqio engine: give an NVMe or UFS device (fake…, vfio:…)"
                    .into(),
            )),
            // The loop's slot buffers are device addresses only; a socket
            // needs host memory (the TCP job queue moves DmaBufs instead).
            Target::Tcp(_) => Err(PerfError::Usage(
                "--minimal runs on PCIe NVMe and UFS devices (fake…, vfio:…), not yet on tcp:"
                    .into(),
            )),
        }
    }
}

/// Run the jobs on their freshly built queues, or report why one could
/// not be built.
fn start<Q: JobQueue>(
    qs: Result<Vec<Q>, String>,
    specs: &[JobSpec],
    shared: &Shared,
    clock: Clock,
    ready: impl FnOnce(Result<(), String>),
) -> Result<Vec<JobResult>, String> {
    match qs {
        Ok(qs) => job::run_many(qs, specs, shared, clock, ready).map_err(|e| e.to_string()),
        Err(m) => {
            ready(Err(m.clone()));
            Err(m)
        }
    }
}
