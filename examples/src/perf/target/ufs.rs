//! UFS targets: the in-process fake UFS host controller (`fake-ufs`,
//! `fake-ufs:null`) and a real one through VFIO (`vfio:<BDF>` whose class
//! code says UFS), driven by the engine's [`UfsQueuePair`].
//!
//! A logical unit plays the namespace's role: LUN `n` is the run's
//! namespace `n + 1` (`-N` counts from 1 for every device) and rows say
//! `LU<n>`.
//!
//! Buffers are premapped as in [`super::nvme`]: one DMA region per job,
//! allocated and mapped once, cut into one [`SlotBuf`] per slot.
//!
//! In MCQ mode each job owns one hardware SQ/CQ pair. In legacy
//! single-doorbell mode the controller has one transfer request list (32
//! slots, one UTRLDBR doorbell) and the engine hands out one queue pair for
//! it; with several jobs they share it behind a mutex here, as the hardware
//! serialises them on the one doorbell. That lock (and the shared slots) is
//! what MCQ removes, so the MCQ-vs-legacy comparison includes it. Its
//! completions carry the job in the tag's upper half; one job's poll may
//! reap another's, which waits in that job's list until it polls.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mcqio::ufs::{HpbConfig, HpbStats, UfsController, UfsMode, UfsOptions, UfsQueuePair};
use mcqio_fixtures::ufs::{
    FakeUfs, FtlConfig, HpbConfig as DevHpb, HpbControl as DevControl, LuConfig, ModelClock,
    UfsConfig,
};
use mcqio_open::{Backing, CtrlOptions, Device, Fake, OpenError};
use mcqio_vfio::{IommuStats, OpenOptions as VfioOpenOptions};

use super::{CtrlInfo, FakeThread, Namespace, OpenPlan};
use crate::queue::{IoReq, IoStatus, JobQueue, PushError, QueueError};
use crate::report::HpbReport;
use crate::slots::{push_err, status_of, BlockJobQueue, SlotBuf, SlotBuffers};
use crate::spec::{DeviceKind, DeviceSpec};
use crate::workload::Op;

/// The most commands per queue the engine keeps outstanding on UFS.
const MAX_UFS_DEPTH: usize = 256;

/// A UFS controller driven by the engine.
pub struct UfsTarget {
    ctrl: Arc<UfsController>,
    fake: Option<Arc<FakeUfs>>,
    info: CtrlInfo,
    /// Legacy mode with more than one job: the one list, shared.
    shared: Option<Arc<Mutex<LegacyList>>>,
    /// How the jobs' queue pairs wait (`--wait`; MCQ sleeps on the
    /// controller's INTx line, legacy polls).
    wait: mcqio::WaitPolicy,
}

impl std::fmt::Debug for UfsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UfsTarget")
            .field("describe", &self.info.describe)
            .finish_non_exhaustive()
    }
}

/// Why a UFS target cannot run the jobs asked for.
#[derive(Debug)]
pub enum UfsOpenError {
    /// MCQ gave fewer queues than jobs.
    Queues {
        /// Queues set up.
        granted: usize,
    },
    /// Anything else, with its message.
    Other(String),
}

impl UfsTarget {
    /// Open the device `spec` names (`fake-ufs…`, or `vfio:…` on a UFS
    /// host controller).
    pub fn open(spec: &DeviceSpec, plan: &OpenPlan) -> Result<Self, UfsOpenError> {
        let jobs = plan.jobs.max(1);
        let depth = plan.depth.clamp(1, MAX_UFS_DEPTH);
        let mut notes = Vec::new();
        // Job core and the fake's device-thread core (threaded fakes only).
        let mut cores = None;
        let (backing, what) = match &spec.kind {
            DeviceKind::FakeUfs { null } => {
                let o = &spec.opts;
                let base = spec
                    .fake_ufs_config()
                    .ok_or_else(|| UfsOpenError::Other("not a fake-ufs".into()))?;
                let thread = FakeThread::place(o.core, o.sync == Some(true), plan, &mut notes);
                cores = thread.cores;
                let lus = base.lus.len();
                let lu_bytes = base.lus.first().map_or(0, |l| l.blocks() * 4096);
                let base = match plan.hpb {
                    Some(_) => hpb_fake(base, *null, &mut notes),
                    None => base,
                };
                let cfg = mcqio_fixtures::ufs::UfsConfig {
                    // One MCQ queue per job unless queues= says otherwise.
                    queues: o.queues.unwrap_or(jobs.clamp(1, 32) as u8),
                    // Room for the queue depth asked for (the engine takes
                    // the smallest of MAC, bQueueDepth and its own limit).
                    mac: depth.clamp(64, 512) as u16,
                    queue_depth: depth.clamp(32, 255) as u8,
                    exec: thread.exec(),
                    seed: plan.seed,
                    ..base
                };
                let d = format!(
                    "fake UFS host controller ({}, {} × {}, 4096 B blocks, device thread on {})",
                    if *null { "null LUs" } else { "RAM LUs" },
                    crate::report::count_of(lus, "LU"),
                    crate::report::bytes_text(lu_bytes),
                    thread.describe()
                );
                (Backing::FakeUfs(cfg), Some(d))
            }
            DeviceKind::Vfio { bdf } => {
                if spec.opts.shadow.is_some() {
                    return Err(UfsOpenError::Other(
                        "shadow= is an NVMe option: a UFS host controller has no shadow doorbells"
                            .into(),
                    ));
                }
                let io = plan.io_size.div_ceil(4096) * 4096;
                let per_job = depth as u64 * (io + 4096) + (1 << 20);
                // The opener lets a UFS class code through (the default
                // refuses anything but an NVMe controller).
                let options = VfioOpenOptions {
                    dma_budget: jobs as u64 * per_job + (2 << 20),
                    ..spec.vfio_options()
                };
                let b = Backing::Vfio {
                    bdf: bdf.clone(),
                    options,
                };
                (b, None)
            }
            _ => {
                return Err(UfsOpenError::Other(format!(
                    "{} is not a UFS device spec",
                    spec.label()
                )))
            }
        };
        let other = |e: OpenError| UfsOpenError::Other(e.why());
        let attached = backing.attach().map_err(other)?;
        let fake = match &attached.fake {
            Some(Fake::Ufs(f)) => Some(f.clone()),
            _ => None,
        };
        let what = what.unwrap_or_else(|| format!("{} (VFIO, UFS)", attached.backend.name()));
        let hpb = plan.hpb.map(|budget| HpbConfig {
            memory_budget: budget,
            ..HpbConfig::default()
        });
        let opts = UfsOptions {
            mcq: spec.opts.mcq.unwrap_or(true),
            queues: jobs.min(32) as u16,
            // Room for HPB's map loads next to the job's own commands.
            depth: (depth + hpb.as_ref().map_or(0, |h| h.inflight_map_loads as usize)) as u16,
            max_transfer: plan.io_size.clamp(4096, u64::from(u32::MAX)) as u32,
            hpb,
            ..UfsOptions::default()
        };
        let opts = CtrlOptions {
            ufs: opts,
            ..CtrlOptions::default()
        };
        let Device::Ufs(ctrl) = attached.open(&opts).map_err(other)?.device else {
            return Err(UfsOpenError::Other(format!(
                "{} is not a UFS host controller",
                spec.label()
            )));
        };
        if plan.hpb.is_some() && ctrl.hpb_stats_all().is_empty() {
            notes.push("--hpb: the device has no HPB logical unit; HPB is off".into());
        }
        let mode = ctrl.mode();
        let shared = match mode {
            UfsMode::Mcq { queues } => {
                if usize::from(queues) < jobs {
                    return Err(UfsOpenError::Queues {
                        granted: usize::from(queues),
                    });
                }
                None
            }
            UfsMode::Legacy if jobs > 1 => {
                notes.push(format!(
                    "legacy single-doorbell mode: the {jobs} jobs share the one {}-slot transfer request list \
                     and its UTRLDBR doorbell behind a lock in mcqio-perf, as the hardware serialises them on \
                     one doorbell; that lock and the shared slots are what MCQ removes",
                    ctrl.depth()
                ));
                let qp = ctrl
                    .create_qpair_for::<SlotBuf>(Default::default())
                    .map_err(|e| UfsOpenError::Other(e.to_string()))?;
                Some(Arc::new(Mutex::new(LegacyList {
                    qp,
                    pending: Vec::with_capacity(jobs),
                    lost: false,
                })))
            }
            UfsMode::Legacy => None,
        };
        let describe = format!(
            "mcqio engine on the {what}, {}",
            match mode {
                UfsMode::Mcq { queues } => format!(
                    "MCQ: {queues} SQ/CQ pair(s) x {} slots, one per job",
                    ctrl.depth()
                ),
                UfsMode::Legacy => format!(
                    "legacy single doorbell: one {}-slot list{}",
                    ctrl.depth(),
                    if jobs > 1 {
                        format!(" shared by {jobs} jobs")
                    } else {
                        String::new()
                    }
                ),
            }
        );
        if plan.wait != mcqio::WaitPolicy::Poll && mode == UfsMode::Legacy {
            notes.push(
                "--wait: legacy single-doorbell mode polls (only MCQ queue pairs sleep on the interrupt)"
                    .into(),
            );
        }
        let lus = ctrl.logical_units();
        let Some(first) = lus.first() else {
            return Err(UfsOpenError::Other("the device has no logical unit".into()));
        };
        let lbads = first.block_len;
        if lus.iter().any(|l| l.block_len != lbads) {
            notes.push("LUs have different block sizes; I/O sizes follow the first LU".into());
        }
        let namespaces = lus
            .iter()
            .map(|l| Namespace {
                nsid: u32::from(l.lun) + 1,
                blocks: l.blocks,
            })
            .collect();
        Ok(UfsTarget {
            ctrl,
            fake,
            info: CtrlInfo {
                namespaces,
                lbads,
                describe,
                notes,
                cores,
            },
            shared,
            wait: plan.wait,
        })
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

    /// HPB counters of every LU with HPB on.
    pub fn hpb_stats(&self) -> Vec<HpbStats> {
        self.ctrl.hpb_stats_all()
    }

    /// The IOMMU counters of the controller's DMA space.
    pub fn iommu_stats(&self) -> IommuStats {
        self.ctrl.dma().iommu().counters().snapshot()
    }

    /// The job's premapped buffers: `depth` slots of `buf_len` bytes.
    fn buffers(&self, depth: usize, buf_len: usize) -> Result<SlotBuffers, String> {
        SlotBuffers::alloc(self.ctrl.dma(), depth, buf_len)
    }

    /// The job's queue: its own queue pair (MCQ, or legacy with one job),
    /// for LU `nsid - 1`.
    pub fn queue(&self, nsid: u32, depth: usize, buf_len: usize) -> Result<UfsJobQueue, String> {
        let lun = lun_of(nsid)?;
        let qp = self
            .ctrl
            .create_qpair_for::<SlotBuf>(mcqio::UfsQpairOptions {
                wait: self.wait,
                ..Default::default()
            })
            .map_err(|e| e.to_string())?;
        let depth = depth.min(qp.depth()).max(1);
        let mem = self.buffers(depth, buf_len)?;
        Ok(BlockJobQueue::new(qp, lun, mem))
    }

    /// The job's share of the legacy list, if jobs share it.
    pub fn shared_queue(
        &self,
        nsid: u32,
        depth: usize,
        buf_len: usize,
    ) -> Option<Result<SharedJobQueue, String>> {
        let list = self.shared.as_ref()?;
        Some((|| {
            let lun = lun_of(nsid)?;
            let mut l = lock(list);
            let depth = depth.min(l.qp.depth()).max(1);
            let mem = self.buffers(depth, buf_len)?;
            let id = l.pending.len();
            l.pending.push(Vec::with_capacity(depth));
            drop(l);
            Ok(SharedJobQueue {
                list: Arc::clone(list),
                id,
                lun,
                inflight: 0,
                mine: Vec::with_capacity(depth),
                device_may_access: false,
                mem,
            })
        })())
    }
}

/// `--hpb` on the fake: the flash cost model (modelled time = wall time),
/// sparse LUs (so large ranges cost memory only where written) and HPB in
/// device control on every LU.
fn hpb_fake(base: UfsConfig, null: bool, notes: &mut Vec<String>) -> UfsConfig {
    let lus = if null {
        base.lus
    } else {
        base.lus
            .iter()
            .map(|l| LuConfig::Sparse { blocks: l.blocks() })
            .collect()
    };
    let n = lus.len();
    notes.push(
        "--hpb on fake-ufs: the device runs its flash cost model (tR 50 us, 4 NAND units, 1 MiB map cache, \
         wall-clock deadlines) with sparse LUs and HPB in device control"
            .into(),
    );
    UfsConfig {
        lus,
        // The cost model the device string asked for (tr=, dies=, ...),
        // else the default one.
        ftl: Some(base.ftl.clone().unwrap_or(FtlConfig {
            clock: ModelClock::Wall,
            ..FtlConfig::default()
        })),
        hpb: Some(DevHpb {
            control: DevControl::Device,
            lu_mask: if n >= 32 { u32::MAX } else { (1u32 << n) - 1 },
            max_active_regions: 4096,
            ..DevHpb::default()
        }),
        ..base
    }
}

fn lun_of(nsid: u32) -> Result<u8, String> {
    nsid.checked_sub(1)
        .and_then(|l| u8::try_from(l).ok())
        .ok_or_else(|| format!("namespace {nsid} is no UFS logical unit"))
}

fn lock(list: &Mutex<LegacyList>) -> MutexGuard<'_, LegacyList> {
    // A job that panicked holding the lock left the list as consistent as
    // any poll leaves it.
    list.lock().unwrap_or_else(|p| p.into_inner())
}

/// One job's own UFS queue pair and its premapped buffers.
pub type UfsJobQueue = BlockJobQueue<UfsQueuePair<SlotBuf>>;

/// The legacy list shared by several jobs.
struct LegacyList {
    qp: UfsQueuePair<SlotBuf>,
    /// Per job: completions reaped but not yet handed to it (capacity: the
    /// job's depth, so pushing never allocates).
    pending: Vec<Vec<(usize, IoStatus)>>,
    /// A completion came without its buffer.
    lost: bool,
}

/// One job's share of the legacy list: its own buffers, the list's slots
/// and doorbell taken under the list's lock.
pub struct SharedJobQueue {
    list: Arc<Mutex<LegacyList>>,
    /// Index in `pending`; the upper half of every tag.
    id: usize,
    lun: u8,
    inflight: usize,
    /// This job's completions taken out of `pending` (same capacity).
    mine: Vec<(usize, IoStatus)>,
    device_may_access: bool,
    mem: SlotBuffers,
}

impl SharedJobQueue {
    /// Move every completion the list has into its job's pending list and
    /// this job's into `mine`.
    fn collect(&mut self) -> Result<(), QueueError> {
        let mut g = lock(&self.list);
        let LegacyList { qp, pending, lost } = &mut *g;
        let r = qp.poll(usize::MAX, |c| {
            *lost |= c.buf.is_none();
            let job = (c.tag >> 32) as usize;
            let slot = (c.tag & 0xffff_ffff) as usize;
            if let Some(p) = pending.get_mut(job) {
                p.push((slot, status_of(&c)));
            }
        });
        self.device_may_access |= *lost;
        std::mem::swap(&mut self.mine, &mut pending[self.id]);
        drop(g);
        r.map(|_| ()).map_err(|e| QueueError(e.to_string()))
    }
}

impl Drop for SharedJobQueue {
    fn drop(&mut self) {
        // Wait a little for this job's commands still in flight (a job
        // that stopped on an error); the list itself closes when the
        // target drops.
        let start = Instant::now();
        while self.inflight > 0 && start.elapsed() < Duration::from_secs(2) {
            if self.collect().is_err() {
                break;
            }
            self.inflight = self.inflight.saturating_sub(self.mine.len());
            self.mine.clear();
        }
        let lost = self.device_may_access || self.inflight > 0;
        self.mem.release(lost);
    }
}

impl JobQueue for SharedJobQueue {
    fn depth(&self) -> usize {
        self.mem.bufs.len()
    }

    fn buffer_len(&self) -> usize {
        self.mem.buf_len
    }

    #[inline]
    fn buffer(&self, slot: usize) -> NonNull<u8> {
        self.mem.ptrs[slot]
    }

    #[inline]
    fn push(&mut self, slot: usize, req: IoReq) -> Result<(), PushError> {
        let buf = self.mem.bufs[slot];
        let tag = (self.id as u64) << 32 | slot as u64;
        let mut g = lock(&self.list);
        let r = match req.op {
            Op::Read => g.qp.read(self.lun, req.slba, req.nlb, buf, tag),
            Op::Write => g.qp.write(self.lun, req.slba, req.nlb, buf, tag),
        };
        drop(g);
        match r {
            Ok(()) => {
                self.inflight += 1;
                Ok(())
            }
            Err(e) => Err(push_err(e.kind)),
        }
    }

    #[inline]
    fn submit(&mut self, _inflight: usize) -> Result<(), QueueError> {
        lock(&self.list).qp.submit();
        Ok(())
    }

    #[inline]
    fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
        self.collect()?;
        let n = self.mine.len();
        self.inflight = self.inflight.saturating_sub(n);
        for &(slot, status) in &self.mine {
            done(slot, status);
        }
        self.mine.clear();
        Ok(n)
    }
}

/// The report's copy of the engine's HPB counters of one LU.
impl From<&HpbStats> for HpbReport {
    fn from(s: &HpbStats) -> Self {
        HpbReport {
            lun: s.lun,
            control: if s.host_control { "host" } else { "device" }.into(),
            hpb_reads: s.hpb_reads,
            normal_reads: s.normal_reads,
            map_loads: s.map_loads,
            stale_fallbacks: s.stale_fallbacks,
            evictions: s.evictions,
            host_map_bytes: s.host_map_bytes,
            host_map_bytes_peak: s.host_map_bytes_peak,
            memory_budget: s.memory_budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(jobs: usize) -> OpenPlan {
        OpenPlan {
            jobs,
            depth: 8,
            io_queue_size: None,
            io_size: 4096,
            writes: true,
            job_cores: Vec::new(),
            seed: 1,
            dma: crate::queue::DmaMode::Premapped,
            hpb: None,
            wait: mcqio::WaitPolicy::Poll,
        }
    }

    /// Legacy mode hands out one queue pair, so two jobs
    /// share it; each gets back exactly its own completions.
    #[test]
    fn legacy_jobs_share_the_one_list_and_get_their_own_completions() {
        let spec: DeviceSpec = "fake-ufs,mcq=off,sync=1".parse().expect("spec");
        let t = UfsTarget::open(&spec, &plan(2))
            .map_err(|e| format!("{e:?}"))
            .expect("open");
        assert_eq!(t.ctrl.mode(), UfsMode::Legacy);
        let mut a = t.shared_queue(1, 8, 4096).expect("shared").expect("a");
        let mut b = t.shared_queue(1, 8, 4096).expect("shared").expect("b");
        let req = IoReq {
            op: Op::Write,
            slba: 0,
            nlb: 1,
        };
        for s in 0..3 {
            a.push(
                s,
                IoReq {
                    slba: s as u64,
                    ..req
                },
            )
            .expect("a push");
        }
        b.push(5, IoReq { slba: 9, ..req }).expect("b push");
        a.submit(3).expect("submit");
        b.submit(1).expect("submit");
        let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
        let start = Instant::now();
        while (got_a.len() < 3 || got_b.is_empty()) && start.elapsed() < Duration::from_secs(5) {
            // b polls first: it reaps a's completions too and keeps them for a.
            b.reap(|s, st| got_b.push((s, st))).expect("b reap");
            a.reap(|s, st| got_a.push((s, st))).expect("a reap");
        }
        got_a.sort_by_key(|x| x.0);
        assert_eq!(
            got_a,
            vec![(0, IoStatus::Ok), (1, IoStatus::Ok), (2, IoStatus::Ok)]
        );
        assert_eq!(got_b, vec![(5, IoStatus::Ok)]);
        // The MCQ mode gives each job its own queue pair instead.
        assert!(t.queue(1, 8, 4096).is_err(), "legacy has one queue pair");
    }
}
