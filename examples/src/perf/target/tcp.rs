//! The NVMe/TCP target (`tcp:<addr>:<port>/<nqn>`): the engine's
//! [`TcpQueuePair`], one per job (each its own connection), created on the
//! job's thread.
//!
//! A socket copies between the wire and the buffer, so the queue pair
//! needs each buffer's host address: the slots are [`DmaBuf`]s (one region
//! cut in `depth` pieces, allocated once), moved into the queue pair per
//! I/O and back in its completion — not the IOVA-only slices the PCIe and
//! UFS jobs move.

use std::ptr::NonNull;
use std::sync::Arc;

use mcqio::core::block::BlockQueue;
use mcqio::nvme::tcp::{TcpController, TcpQueuePair};
use mcqio::{Completion, ControllerOptions, DmaBuf, IoError, QpairOptions};
use mcqio_open::{CtrlOptions, Device};
use mcqio_vfio::DmaDir;

use super::{CtrlInfo, Namespace, OpenPlan};
use crate::queue::{Failure, IoReq, IoStatus, JobQueue, PushError, QueueError};
use crate::slots::push_err;
use crate::spec::DeviceSpec;
use crate::workload::Op;

/// An NVMe/TCP controller driven by the engine.
pub struct TcpTarget {
    ctrl: Arc<TcpController>,
    info: CtrlInfo,
    /// How its queue pairs wait (`--wait`): `irq` and `hybrid` sleep on
    /// the connection's socket.
    wait: mcqio::WaitPolicy,
}

impl std::fmt::Debug for TcpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTarget")
            .field("describe", &self.info.describe)
            .finish_non_exhaustive()
    }
}

impl TcpTarget {
    /// Connect to the target `spec` names and bring the controller up,
    /// asking for one I/O queue per job (or `qpairs=`).
    pub fn open(spec: &DeviceSpec, plan: &OpenPlan) -> Result<Self, String> {
        let mut backing = spec.backing("mcqio-perf").map_err(|e| e.to_string())?;
        if let mcqio_open::Backing::Tcp { options, .. } = &mut backing {
            if spec.opts.qpairs.is_none() {
                options.io_queues = plan.jobs.clamp(1, 1024) as u16;
            }
        }
        let opts = CtrlOptions {
            nvme: ControllerOptions {
                max_transfer: plan.io_size.max(4096),
                ..ControllerOptions::default()
            },
            ..CtrlOptions::default()
        };
        let Device::Tcp(ctrl) = backing.open(&opts).map_err(|e| e.why())?.device else {
            return Err(format!("{} is not an NVMe/TCP target", spec.label()));
        };
        let Some(first) = ctrl.namespaces().first() else {
            return Err("the controller has no active namespace".into());
        };
        let lbads = first.lba_size as u32;
        let mut notes = vec![
            "NVMe/TCP: one connection per job; a sendmsg per submit batch and a recv per \
             receive batch (paced: see wire system calls per I/O), data copied between the \
             socket buffer and the I/O buffer"
                .to_string(),
        ];
        if ctrl
            .namespaces()
            .iter()
            .any(|n| n.lba_size != first.lba_size)
        {
            notes
                .push("namespaces have different block sizes; I/O sizes follow namespace 1".into());
        }
        let o = ctrl.options();
        let describe = format!(
            "mcqio engine over NVMe/TCP to {} {} (controller {}, digests header {} data {}, in-capsule {} B)",
            ctrl.addr(),
            o.subnqn,
            ctrl.cntlid(),
            o.header_digest,
            o.data_digest,
            ctrl.in_capsule_bytes()
        );
        Ok(TcpTarget {
            info: CtrlInfo {
                namespaces: ctrl
                    .namespaces()
                    .iter()
                    .map(|n| Namespace {
                        nsid: n.id,
                        blocks: n.nsze,
                    })
                    .collect(),
                lbads,
                describe,
                notes,
                cores: None,
            },
            ctrl,
            wait: plan.wait,
        })
    }

    /// I/O queues the controller granted.
    pub fn granted_io_queues(&self) -> usize {
        self.ctrl.granted_io_queues()
    }

    /// What the run and the report need to know.
    pub fn info(&self) -> &CtrlInfo {
        &self.info
    }

    /// A queue pair for `nsid` with `depth` slots of `buf_len` bytes.
    pub fn queue(&self, nsid: u32, depth: usize, buf_len: usize) -> Result<TcpJobQueue, String> {
        let children = (buf_len as u64)
            .div_ceil(self.ctrl.max_transfer().max(1))
            .max(1);
        let most = (self.ctrl.cap().max_queue_entries() as usize)
            .saturating_sub(1)
            .min(4096);
        let qp_depth = depth.saturating_mul(children as usize).min(most).max(depth) as u16;
        let qp = self
            .ctrl
            .create_qpair(QpairOptions {
                depth: qp_depth,
                wait: self.wait,
                ..QpairOptions::default()
            })
            .map_err(|e| e.to_string())?;
        let region = self
            .ctrl
            .alloc_buf(depth * buf_len, DmaDir::Bidirectional)
            .map_err(|e| format!("cannot allocate {} bytes of buffers: {e}", depth * buf_len))?;
        let bufs = region
            .chunks(buf_len)
            .map_err(|e| format!("cutting the job's buffers: {e}"))?;
        let ptrs = bufs.iter().map(DmaBuf::as_ptr).collect();
        Ok(TcpJobQueue {
            qp,
            nsid,
            buf_len,
            bufs: bufs.into_iter().map(Some).collect(),
            ptrs,
        })
    }
}

/// One job's NVMe/TCP queue pair and its buffers (each in its slot, or in
/// the queue pair while its I/O is in flight).
pub struct TcpJobQueue {
    qp: TcpQueuePair<DmaBuf>,
    nsid: u32,
    buf_len: usize,
    bufs: Vec<Option<DmaBuf>>,
    ptrs: Vec<NonNull<u8>>,
}

fn status_of(c: &Completion<DmaBuf>) -> IoStatus {
    let failure = match c.result {
        Ok(()) => return IoStatus::Ok,
        Err(IoError::Nvme(s)) => Failure::Nvme(s),
        Err(e) => Failure::Host(e),
    };
    if c.buf.is_some() {
        IoStatus::Failed(failure)
    } else {
        IoStatus::Lost(failure)
    }
}

impl JobQueue for TcpJobQueue {
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
            return Err(PushError::Rejected(format!("slot {slot} is in flight")));
        };
        let r = match req.op {
            Op::Read => self.qp.read(self.nsid, req.slba, req.nlb, buf, slot as u64),
            Op::Write => self
                .qp
                .write(self.nsid, req.slba, req.nlb, buf, slot as u64),
        };
        r.map_err(|e| {
            let kind = e.kind;
            self.bufs[slot] = Some(e.into_buf());
            push_err(kind)
        })
    }

    #[inline]
    fn submit(&mut self, _inflight: usize) -> Result<(), QueueError> {
        self.qp.submit();
        Ok(())
    }

    /// `--wait irq|hybrid`: sleeps on the socket in the queue pair's
    /// `wait`.
    fn wait<F: FnMut(usize, IoStatus)>(
        &mut self,
        timeout: std::time::Duration,
        mut done: F,
    ) -> Result<usize, QueueError> {
        let bufs = &mut self.bufs;
        self.qp
            .wait(usize::MAX, Some(timeout), |mut c| {
                let st = status_of(&c);
                let slot = c.tag as usize;
                if let Some(b) = c.buf.take() {
                    bufs[slot] = Some(b);
                }
                done(slot, st);
            })
            .map_err(|e| QueueError(e.to_string()))
    }

    fn counters(&self) -> Option<mcqio::QueueCounters> {
        Some(self.qp.counters())
    }

    fn wire_syscalls(&self) -> u64 {
        let s = self.qp.stats();
        s.sends + s.recvs
    }

    #[inline]
    fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
        let bufs = &mut self.bufs;
        self.qp
            .poll(usize::MAX, |mut c| {
                let st = status_of(&c);
                let slot = c.tag as usize;
                if let Some(b) = c.buf.take() {
                    bufs[slot] = Some(b);
                }
                done(slot, st);
            })
            .map_err(|e| QueueError(e.to_string()))
    }
}
