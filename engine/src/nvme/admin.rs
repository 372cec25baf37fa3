//! The admin queue: one command at a time under the controller's lock,
//! Asynchronous Event Requests kept posted and their events collected,
//! Identify pages and the active namespace list, [`Controller::admin_read`].
//! Written in NVMe's admin command set only (what an NVMe/TCP wire would
//! reuse); the rings it runs on are the PCIe transport's.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mcqio_vfio::{DmaDir, DmaRegion, Mmio};

use crate::core::error::{Error, Result};
use crate::nvme::ctrl::{failure_error, Controller};
use crate::nvme::pcie::enable::read_csts;
use crate::nvme::pcie::queue::cq::CompQueue;
use crate::nvme::pcie::queue::sq::SubQueue;
use crate::nvme::pcie::queue::PAGE_SIZE;
use crate::nvme::spec::identify::{IdentifyController, IDENTIFY_LEN};
use crate::nvme::spec::opcodes::admin as admin_op;
use crate::nvme::spec::sqe::{AsyncEventRequest, Command, Identify};
use crate::nvme::spec::status::{generic, sct};
use crate::nvme::spec::{Cqe, NvmeStatus, Sqe};

/// The admin queue pair plus a 4 KiB data page for identify and logs.
pub(in crate::nvme) struct AdminQueue {
    pub(in crate::nvme) sq: SubQueue,
    pub(in crate::nvme) cq: CompQueue,
    pub(in crate::nvme) next_cid: u16,
    pub(in crate::nvme) data: DmaRegion,
    /// Asynchronous Event Requests the controller holds.
    pub(in crate::nvme) aers: u16,
    /// Events received and not yet handed out.
    pub(in crate::nvme) events: VecDeque<AsyncEvent>,
    /// Asynchronous Event Requests to keep posted (re-posted after a reset).
    pub(in crate::nvme) aer_target: u16,
    /// Which AER CIDs (`AER_CID_BASE + bit`) the controller holds.
    pub(in crate::nvme) aer_out: [u64; 4],
    /// Ring entries (both queues).
    pub(in crate::nvme) entries: u16,
}

/// CIDs from here up belong to Asynchronous Event Requests (one per
/// outstanding AER), so their completions — which arrive at any time — are
/// never mistaken for the command being waited on.
pub(in crate::nvme) const AER_CID_BASE: u16 = 0xFF00;

/// Asynchronous events kept until [`Controller::async_events`] takes them;
/// beyond this the oldest are dropped.
pub(in crate::nvme) const MAX_EVENTS: usize = 256;

/// Event types of an asynchronous event (completion dword 0, bits 2:0).
pub mod event_type {
    /// Error status.
    pub const ERROR: u8 = 0;
    /// SMART / health status.
    pub const SMART_HEALTH: u8 = 1;
    /// Notice (namespace attribute changed, firmware activation, ...).
    pub const NOTICE: u8 = 2;
    /// I/O command set specific.
    pub const IO_COMMAND_SET: u8 = 6;
    /// Vendor specific.
    pub const VENDOR: u8 = 7;
}

/// An asynchronous event the controller reported.
///
/// The controller masks further events of the same type until the host
/// reads `log_page` (Get Log Page without Retain Asynchronous Event).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// Event type ([`event_type`]).
    pub event_type: u8,
    /// Event information (meaning depends on the type).
    pub info: u8,
    /// Log page that holds the details.
    pub log_page: u8,
}

impl AsyncEvent {
    /// Decode completion dword 0 of an Asynchronous Event Request.
    pub const fn from_dw0(dw0: u32) -> Self {
        AsyncEvent {
            event_type: (dw0 & 0b111) as u8,
            info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }
}

impl AdminQueue {
    pub(in crate::nvme) fn exec(
        &mut self,
        regs: &dyn Mmio,
        sqe: Sqe,
        what: &'static str,
        timeout: Duration,
    ) -> Result<Cqe> {
        let cid = self.next_cid;
        self.next_cid = if cid + 1 >= AER_CID_BASE { 0 } else { cid + 1 };
        self.sq.push(sqe.with_cid(cid));
        self.sq.flush();
        let start = Instant::now();
        let timed_out = || Error::Timeout {
            what,
            timeout_ms: timeout.as_millis() as u64,
        };
        let mut spins = 0u32;
        loop {
            if let Some(cqe) = self.cq.peek() {
                self.cq.advance();
                self.cq.flush();
                if cqe.cid != cid {
                    if !self.on_aer(cqe) {
                        log::warn!("admin queue: dropped stale completion cid {:#06x} (waiting for {cid:#06x})", cqe.cid);
                    }
                    // A device can post completions that are not ours
                    // without end: the deadline holds regardless.
                    if start.elapsed() >= timeout {
                        return Err(timed_out());
                    }
                    continue;
                }
                let st = cqe.nvme_status();
                if !st.is_success() {
                    return Err(Error::Command {
                        command: what,
                        status: st,
                    });
                }
                return Ok(cqe);
            }
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 {
                let c = read_csts(regs)?;
                if c.cfs() {
                    return Err(Error::ControllerFatal);
                }
                if start.elapsed() >= timeout {
                    return Err(timed_out());
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl AdminQueue {
    /// Post one Asynchronous Event Request with `cid` (>= AER_CID_BASE).
    /// A completed AER is re-posted with its own CID, so outstanding AERs
    /// never share one.
    pub(in crate::nvme) fn post_aer(&mut self, cid: u16) {
        let i = cid.wrapping_sub(AER_CID_BASE);
        self.aer_out[i as usize / 64] |= 1 << (i % 64);
        self.aers += 1;
        self.sq.push(AsyncEventRequest.sqe().with_cid(cid));
        self.sq.flush();
    }

    /// A completion arrived that is not the command being waited on. If it
    /// ends an outstanding Asynchronous Event Request: keep the event and
    /// re-arm, or (error status, e.g. aborted at shutdown) let it go, and
    /// return true. Anything else (a CID in the AER range that is not
    /// outstanding included) is stale: false. So a device cannot make the
    /// host post more AERs than it has outstanding, nor grow the event
    /// queue without bound.
    pub(in crate::nvme) fn on_aer(&mut self, cqe: Cqe) -> bool {
        let Some(i) = cqe.cid.checked_sub(AER_CID_BASE) else {
            return false;
        };
        let (w, bit) = (i as usize / 64, 1u64 << (i % 64));
        if self.aer_out[w] & bit == 0 {
            return false;
        }
        self.aer_out[w] &= !bit;
        self.aers = self.aers.saturating_sub(1);
        let st = cqe.nvme_status();
        if st.is_success() {
            let ev = AsyncEvent::from_dw0(cqe.dw0);
            log::info!("asynchronous event: {ev:?}");
            if self.events.len() >= MAX_EVENTS {
                log::warn!("asynchronous events: queue full; dropping the oldest");
                self.events.pop_front();
            }
            self.events.push_back(ev);
            self.post_aer(cqe.cid);
        } else {
            log::warn!("Asynchronous Event Request ended with {st}; not re-posted");
        }
        true
    }

    /// Consume whatever the admin CQ holds (AER completions; anything else
    /// is stale here since no command is being waited on). Bounded by one
    /// lap of the ring, so a device that keeps posting cannot hold it.
    pub(in crate::nvme) fn drain(&mut self) {
        for _ in 0..self.entries {
            let Some(cqe) = self.cq.peek() else { break };
            self.cq.advance();
            if !self.on_aer(cqe) {
                log::warn!("admin queue: dropped stale completion cid {:#06x}", cqe.cid);
            }
        }
        self.cq.flush();
    }
}

pub(in crate::nvme) fn identify_page(
    admin: &mut AdminQueue,
    regs: &dyn Mmio,
    cmd: Identify,
    what: &'static str,
    t: Duration,
) -> Result<Vec<u8>> {
    admin.data.fill(0);
    let prp = admin.data.iova().raw();
    admin.exec(regs, cmd.sqe().with_prp(prp, 0), what, t)?;
    let mut v = vec![0; IDENTIFY_LEN];
    admin.data.read_bytes(0, &mut v)?;
    Ok(v)
}

/// Most active namespaces mcqio takes from one controller. Each costs an
/// Identify at bring-up (and after every reset), so a device that reports
/// an endless list is refused instead of keeping bring-up busy.
pub const MAX_NAMESPACES: usize = 1 << 14;

/// Most bytes [`Controller::admin_read`] transfers: PRP1's page plus one
/// PRP list page of 512 entries.
pub const MAX_ADMIN_READ: u64 = PAGE_SIZE * 513;

/// Active NSIDs via CNS 02h (paged by 1024), falling back to 1..=NN for
/// controllers older than NVMe 1.1 that reject that CNS. The result is
/// strictly increasing (sorted, no duplicates, no 0, no broadcast id), at
/// most [`MAX_NAMESPACES`] long, and may be sparse (any id up to
/// 0xFFFF_FFFE).
pub(in crate::nvme) fn active_namespaces(
    admin: &mut AdminQueue,
    regs: &dyn Mmio,
    id: &IdentifyController,
    t: Duration,
) -> Result<Vec<u32>> {
    active_namespaces_by(id, |cmd, what| identify_page(admin, regs, cmd, what, t))
}

/// [`active_namespaces`] over any way of running an Identify (`identify`
/// returns the 4096-byte page): the seam a fabric controller, whose admin
/// queue is a connection rather than rings, brings up through.
pub(in crate::nvme) fn active_namespaces_by(
    id: &IdentifyController,
    mut identify: impl FnMut(Identify, &'static str) -> Result<Vec<u8>>,
) -> Result<Vec<u32>> {
    let too_many = || Error::BadDevice {
        what: "active namespace list",
        detail: format!("more than {MAX_NAMESPACES} active namespaces"),
    };
    let mut out = Vec::new();
    let mut after = 0u32;
    loop {
        let page = match identify(
            Identify::active_namespaces(after),
            "Identify Active Namespace List",
        ) {
            Ok(p) => p,
            Err(Error::Command { status, .. })
                if status == NvmeStatus::new(sct::GENERIC, generic::INVALID_FIELD)
                    && out.is_empty() =>
            {
                if id.nn as usize > MAX_NAMESPACES {
                    return Err(too_many());
                }
                return Ok((1..=id.nn).collect());
            }
            Err(e) => return Err(e),
        };
        let ids: Vec<u32> = page
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .take_while(|&n| n != 0)
            .collect();
        let full = ids.len() == IDENTIFY_LEN / 4;
        let last = ids.last().copied();
        // The list must be increasing and above `after`; whatever a device
        // returns beyond that is dropped here and sorted out below.
        out.extend(ids.into_iter().filter(|&n| n > after && n < 0xFFFF_FFFF));
        if out.len() > MAX_NAMESPACES {
            return Err(too_many());
        }
        match last {
            Some(l) if full && l > after && l < 0xFFFF_FFFE => after = l,
            _ => break,
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl Controller {
    /// Execute an admin command that returns data to the host — Identify
    /// (4 KiB) or Get Log Page (NUMD dwords, up to [`MAX_ADMIN_READ`]
    /// bytes) — into memory of its own, and return the completion and the
    /// data. The data pointers (PRP1, PRP2 or a PRP list) are built here
    /// for exactly the length the command describes; the caller's data and
    /// metadata pointers, and its PSDT and fused bits, are ignored. Other
    /// opcodes fail with [`Error::AdminRead`] (their transfer length is not
    /// known here): use the `unsafe` [`Controller::admin`].
    pub fn admin_read(&self, sqe: Sqe, what: &'static str) -> Result<(Cqe, Vec<u8>)> {
        let opcode = sqe.opcode();
        let len: u64 = match opcode {
            admin_op::IDENTIFY => IDENTIFY_LEN as u64,
            admin_op::GET_LOG_PAGE => {
                let numd = u64::from(sqe.cdw11 & 0xFFFF) << 16 | u64::from(sqe.cdw10 >> 16);
                (numd + 1) * 4
            }
            _ => {
                return Err(Error::AdminRead {
                    opcode,
                    reason: "only Identify and Get Log Page are supported".into(),
                })
            }
        };
        if len > MAX_ADMIN_READ {
            return Err(Error::AdminRead {
                opcode,
                reason: format!(
                    "{len} bytes is more than the {MAX_ADMIN_READ} one PRP list describes"
                ),
            });
        }
        // Opcode only: no fused operation, PSDT = PRPs; the CID is set by
        // the queue.
        let mut sqe = sqe;
        sqe.cdw0 &= 0xFF;
        sqe.mptr = 0;
        let mut a = self.lock_admin();
        if len as usize <= IDENTIFY_LEN {
            let prp = a.data.iova().raw();
            a.data.fill(0);
            let cqe = self.admin_locked(&mut a, sqe.with_prp(prp, 0), what)?;
            let mut v = vec![0; len as usize];
            a.data.read_bytes(0, &mut v)?;
            return Ok((cqe, v));
        }
        // More than one page: a buffer of its own, described by PRP2 (two
        // pages) or a PRP list (up to 512 more pages).
        let page = PAGE_SIZE as usize;
        let mut buf = self.dma.alloc(len as usize, DmaDir::Bidirectional)?;
        buf.fill(0);
        let base = buf.iova().raw();
        let pages = (len as usize).div_ceil(page);
        let list = if pages > 2 {
            let mut l = self.dma.alloc(page, DmaDir::ToDevice)?;
            for i in 1..pages {
                l.write_obj::<u64>((i - 1) * 8, base + (i * page) as u64)?;
            }
            Some(l)
        } else {
            None
        };
        let prp2 = match &list {
            Some(l) => l.iova().raw(),
            None => base + page as u64,
        };
        match self.admin_locked(&mut a, sqe.with_prp(base, prp2), what) {
            Ok(cqe) => {
                let mut v = vec![0; len as usize];
                buf.read_bytes(0, &mut v)?;
                Ok((cqe, v))
            }
            // Completed with an error status: the device is done with both.
            Err(e @ Error::Command { .. }) => Err(e),
            Err(e) => {
                // Timed out or failed: the device may still write the
                // buffer (and read the list). Never hand them back.
                std::mem::forget(buf);
                std::mem::forget(list);
                Err(e)
            }
        }
    }

    /// Asynchronous events received so far (collected while admin commands
    /// run, and by checking the admin completion queue now). Each event is
    /// returned once. Read the event's log page to unmask its type.
    pub fn async_events(&self) -> Vec<AsyncEvent> {
        let mut a = self.lock_admin();
        if failure_error(self.state()).is_none() {
            a.drain();
        }
        a.events.drain(..).collect()
    }

    /// Asynchronous Event Requests currently posted to the controller.
    pub fn async_event_requests_posted(&self) -> usize {
        self.admin.lock().unwrap_or_else(|p| p.into_inner()).aers as usize
    }
}
