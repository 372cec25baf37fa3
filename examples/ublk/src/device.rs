//! From an open mcqio device to a served ublk device: the capabilities
//! and parameters from what the engine reports ([`caps_of`],
//! [`params_of`]), and one pinned thread per queue, each owning one ublk
//! queue and one engine queue pair ([`serve`]).

use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use mcqio::nvme::spec::sqe::{Command, Identify};
use mcqio::nvme::tcp::TcpController;
use mcqio::ufs::UfsQpairOptions;
use mcqio::{Controller, QpairOptions, TimeoutPolicy, WaitPolicy};
use mcqio_open::{BlockDevice, BlockUnit, Device};

use crate::null::{NullMode, NullTarget};
use crate::queue::KernelQueue;
use crate::server::{Idle, Server, Stats};
use crate::sys::{self, Params};
use crate::target::{dlfeat_reads_zeroes, Caps, Target};

/// Largest buffer per tag unless asked otherwise (the engine's max
/// transfer may be smaller).
pub const DEFAULT_MAX_IO: u64 = 1 << 20;

/// NVMe Write Zeroes covers at most 65536 blocks.
const NVME_MAX_WRITE_ZEROES: u32 = 1 << 16;

/// Identify Namespace: the byte that says what deallocated blocks read as.
const DLFEAT: usize = 33;

/// The unit of `dev` numbered `id` (NVMe namespace id, UFS LUN), or its
/// first one.
pub fn unit(dev: &Device, id: Option<u32>) -> Result<BlockUnit, String> {
    let units = dev.units();
    match id {
        None => units
            .first()
            .copied()
            .ok_or_else(|| "the device has no namespace or logical unit".into()),
        Some(n) => units.iter().find(|u| u.id == n).copied().ok_or_else(|| {
            format!(
                "no unit {n}: the device has {:?}",
                units.iter().map(|u| u.id).collect::<Vec<_>>()
            )
        }),
    }
}

/// What the server may offer the kernel for `u` on `dev`, with tag
/// buffers of at most `max_io` bytes.
pub fn caps_of(dev: &Device, u: &BlockUnit, max_io: u64) -> Caps {
    let block_shift = u.block_size.trailing_zeros();
    let max_io = max_io.min(dev.max_transfer()).min(u64::from(u32::MAX) / 2);
    let max_io = (max_io >> block_shift << block_shift).max(u64::from(u.block_size)) as u32;
    match dev {
        Device::Nvme(c) => {
            let id = c.identify();
            let dlfeat = nvme_dlfeat(c, u.id);
            Caps {
                block_shift,
                blocks: u.blocks,
                max_io,
                volatile_cache: id.has_volatile_write_cache(),
                fua: true,
                discard: id.supports_dsm(),
                discard_zeroes: id.supports_dsm() && dlfeat.is_some_and(dlfeat_reads_zeroes),
                write_zeroes_blocks: if id.supports_write_zeroes() {
                    NVME_MAX_WRITE_ZEROES
                } else {
                    0
                },
            }
        }
        // The same Identify fields as over PCIe; `max_io` is already
        // within the controller's per-command bound (MDTS, and MAXH2CDATA:
        // `TcpController::max_transfer`). The engine's NVMe/TCP queue pair
        // has no FUA write and no Write Zeroes, so neither is offered: the
        // block layer emulates FUA with a flush and writes zeroes itself.
        Device::Tcp(c) => {
            let id = c.identify();
            let dsm = id.supports_dsm();
            Caps {
                block_shift,
                blocks: u.blocks,
                max_io,
                volatile_cache: id.has_volatile_write_cache(),
                fua: false,
                discard: dsm,
                discard_zeroes: dsm && tcp_dlfeat(c, u.id).is_some_and(dlfeat_reads_zeroes),
                write_zeroes_blocks: 0,
            }
        }
        Device::Ufs(_) => Caps {
            block_shift,
            blocks: u.blocks,
            max_io,
            // SYNCHRONIZE CACHE is always sent on; the engine has no FUA
            // write, so the block layer emulates FUA with a flush.
            volatile_cache: true,
            fua: false,
            discard: true,
            discard_zeroes: false,
            write_zeroes_blocks: 0,
        },
    }
}

/// Namespace `nsid`'s DLFEAT byte (Identify Namespace byte 33), or
/// `None` when the controller does not answer.
pub fn nvme_dlfeat(c: &Controller, nsid: u32) -> Option<u8> {
    let (_, page) = c
        .admin_read(Identify::namespace(nsid).sqe(), "Identify Namespace")
        .ok()?;
    page.get(DLFEAT).copied()
}

/// [`nvme_dlfeat`] over NVMe/TCP.
pub fn tcp_dlfeat(c: &TcpController, nsid: u32) -> Option<u8> {
    let (_, page) = c
        .admin_read(Identify::namespace(nsid).sqe(), 4096, "Identify Namespace")
        .ok()?;
    page.get(DLFEAT).copied()
}

/// The ublk parameters for `caps`.
pub fn params_of(caps: &Caps) -> Params {
    let shift = caps.block_shift as u8;
    let mut attrs = 0;
    if caps.volatile_cache {
        attrs |= sys::ATTR_VOLATILE_CACHE;
        if caps.fua {
            attrs |= sys::ATTR_FUA;
        }
    }
    let mut p = Params {
        len: std::mem::size_of::<Params>() as u32,
        types: sys::PARAM_TYPE_BASIC,
        basic: sys::ParamBasic {
            attrs,
            logical_bs_shift: shift,
            physical_bs_shift: shift,
            io_opt_shift: shift,
            io_min_shift: shift,
            max_sectors: caps.max_io >> 9,
            chunk_sectors: 0,
            dev_sectors: caps.blocks << (caps.block_shift - 9),
            virt_boundary_mask: 0,
        },
        ..Params::default()
    };
    if caps.discard || caps.write_zeroes_blocks > 0 {
        p.types |= sys::PARAM_TYPE_DISCARD;
        p.discard = sys::ParamDiscard {
            discard_alignment: 0,
            discard_granularity: 1 << caps.block_shift,
            // One range per request, at most 1 GiB.
            max_discard_sectors: if caps.discard { 1 << 21 } else { 0 },
            max_write_zeroes_sectors: caps.write_zeroes_blocks << (caps.block_shift - 9),
            max_discard_segments: 1,
            reserved0: 0,
        };
    }
    p
}

/// What each queue thread reports.
pub enum QueueEvent {
    /// Queue `qid` fetched every tag (START_DEV may go once all have).
    Fetched(u16),
    /// Queue `qid` could not start.
    Failed(u16, String),
}

/// How the queues are set up.
#[derive(Clone)]
pub struct ServeOptions {
    /// The open `/dev/ublkcN`.
    pub cdev: Arc<OwnedFd>,
    /// Tags per queue.
    pub depth: u16,
    /// USER_COPY (data by pread/pwrite on `/dev/ublkcN`).
    pub user_copy: bool,
    /// What the device offers.
    pub caps: Caps,
    /// Per-command timeout of the engine's queue pairs.
    pub io_timeout: Option<std::time::Duration>,
    /// How the engine's queue pairs wait, and so how an idle queue
    /// thread does ([`Idle::of`]).
    pub wait: WaitPolicy,
    /// Diagnostics: answer every request at once, without the engine
    /// ([`crate::null`]).
    pub null: Option<NullMode>,
}

fn serve_queue<T: Target>(
    qid: u16,
    qp: &mut T,
    at: T::Addr,
    dev: &Device,
    o: &ServeOptions,
    events: &Sender<QueueEvent>,
    stop: &AtomicBool,
) -> Result<Stats, String> {
    let fail = |e: String| {
        let _ = events.send(QueueEvent::Failed(qid, e.clone()));
        e
    };
    let mut q = KernelQueue::new(o.cdev.clone(), qid, o.depth, o.user_copy)
        .map_err(|e| fail(format!("queue {qid}: {e}")))?;
    if o.null == Some(NullMode::NoCopy) {
        q.skip_user_copies();
    }
    let mut s = Server::new(q, qp, at, o.caps, dev.dma().clone())
        .map_err(|e| fail(format!("queue {qid}: {e}")))?;
    s.set_idle(Idle::of(o.wait));
    s.start()
        .map_err(|e| fail(format!("queue {qid}: FETCH: {e}")))?;
    let _ = events.send(QueueEvent::Fetched(qid));
    let r = s.run(stop);
    let (_, stats) = s.finish();
    r.map_err(|e| format!("queue {qid}: {e}"))?;
    Ok(stats)
}

/// Serve `queues` ublk queues of unit `unit_id` on `dev`, one pinned
/// thread each with its own engine queue pair; returns each queue's
/// counters once every queue's tags are aborted (the device was stopped)
/// or `stop` is set while idle.
pub fn serve(
    dev: &Device,
    unit_id: u32,
    queues: u16,
    o: &ServeOptions,
    events: Sender<QueueEvent>,
    stop: &AtomicBool,
) -> Result<Vec<Result<Stats, String>>, String> {
    let n = usize::from(queues);
    if o.null.is_some() {
        return Ok(serve_null(dev, n, o, &events, stop));
    }
    match dev {
        Device::Nvme(c) => {
            let opts = QpairOptions {
                // Room for every tag and for the engine's split children.
                depth: o.depth.saturating_mul(2).clamp(2, 4096),
                io_timeout: o.io_timeout,
                timeout_policy: TimeoutPolicy::default(),
                wait: o.wait,
                ..QpairOptions::default()
            };
            let events = std::sync::Mutex::new(events);
            mcqio::run_per_core(c, n, opts, |i, qp| {
                let tx = events.lock().unwrap_or_else(|p| p.into_inner()).clone();
                serve_queue(i as u16, qp, unit_id, dev, o, &tx, stop)
            })
            .map_err(|e| e.to_string())
        }
        // One connection per queue thread, as per core over PCIe.
        Device::Tcp(c) => {
            // The target's queues hold CAP.MQES entries (Linux's nvmet-tcp
            // and the fake: 128); beyond them a request waits for a
            // completion instead of failing.
            let most = c.cap().max_queue_entries().saturating_sub(1).clamp(2, 4096) as u16;
            let opts = QpairOptions {
                depth: o.depth.saturating_mul(2).clamp(2, most),
                io_timeout: o.io_timeout,
                timeout_policy: TimeoutPolicy::default(),
                wait: o.wait,
                ..QpairOptions::default()
            };
            let events = std::sync::Mutex::new(events);
            mcqio::run_per_core(c, n, opts, |i, qp| {
                let tx = events.lock().unwrap_or_else(|p| p.into_inner()).clone();
                serve_queue(i as u16, qp, unit_id, dev, o, &tx, stop)
            })
            .map_err(|e| e.to_string())
        }
        Device::Ufs(c) => {
            let at = u8::try_from(unit_id).map_err(|_| format!("LUN {unit_id} out of range"))?;
            let opts = UfsQpairOptions {
                io_timeout: o.io_timeout,
                wait: o.wait,
                ..UfsQpairOptions::default()
            };
            let events = std::sync::Mutex::new(events);
            mcqio::run_per_core(c, n, opts, |i, qp| {
                let tx = events.lock().unwrap_or_else(|p| p.into_inner()).clone();
                serve_queue(i as u16, qp, at, dev, o, &tx, stop)
            })
            .map_err(|e| e.to_string())
        }
    }
}

/// `--null`: `n` threads, pinned as the engine's would be, each serving
/// one queue from a [`NullTarget`] (the device only lends its DMA memory
/// for the tag buffers).
fn serve_null(
    dev: &Device,
    n: usize,
    o: &ServeOptions,
    events: &Sender<QueueEvent>,
    stop: &AtomicBool,
) -> Vec<Result<Stats, String>> {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
                let tx = events.clone();
                s.spawn(move || {
                    if let Some(c) = core {
                        core_affinity::set_for_current(c);
                    }
                    let depth = usize::from(o.depth) * 2;
                    let mut t = NullTarget::new(o.caps.block_shift, depth);
                    serve_queue(i as u16, &mut t, 0, dev, o, &tx, stop)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a queue thread panicked".into()))
            })
            .collect()
    })
}
