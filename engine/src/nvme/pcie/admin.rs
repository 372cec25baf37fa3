//! The admin queue: one command at a time under the controller's lock,
//! Asynchronous Event Requests kept posted and their events collected,
//! the admin rings as the NVMe layer's `Exchange` (Identify at bring-up),
//! [`Controller::admin_read`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mcqio_vfio::{DmaRegion, Mmio};

use crate::core::error::{Error, Result};
use crate::nvme::host::identify::Exchange;
use crate::nvme::host::regs::read_csts;
use crate::nvme::pcie::bar::Bar;
use crate::nvme::pcie::queue::cq::CompQueue;
use crate::nvme::pcie::queue::sq::SubQueue;
use crate::nvme::pcie::queue::PAGE_SIZE;
use crate::nvme::spec::identify::IDENTIFY_LEN;
use crate::nvme::spec::sqe::{AsyncEventRequest, Command};
use crate::nvme::spec::{Cqe, Sqe};

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
                let c = read_csts(&mut Bar(regs))?;
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

/// The admin rings as the NVMe layer's [`Exchange`] (bring-up, reset):
/// a command's data lands in the queue's 4 KiB data page and is copied
/// out.
pub(in crate::nvme) struct RingExchange<'a> {
    q: &'a mut AdminQueue,
    regs: &'a dyn Mmio,
    timeout: Duration,
}

impl AdminQueue {
    /// This queue as an [`Exchange`], each command bounded by `timeout`.
    pub(in crate::nvme) fn exchange_on<'a>(
        &'a mut self,
        regs: &'a dyn Mmio,
        timeout: Duration,
    ) -> RingExchange<'a> {
        RingExchange {
            q: self,
            regs,
            timeout,
        }
    }
}

impl Exchange for RingExchange<'_> {
    fn exchange(&mut self, sqe: Sqe, page: Option<&mut [u8]>, what: &'static str) -> Result<Cqe> {
        let Some(page) = page else {
            return self.q.exec(self.regs, sqe, what, self.timeout);
        };
        debug_assert!(page.len() <= IDENTIFY_LEN);
        self.q.data.fill(0);
        let prp = self.q.data.iova().raw();
        let cqe = self
            .q
            .exec(self.regs, sqe.with_prp(prp, 0), what, self.timeout)?;
        self.q.data.read_bytes(0, page)?;
        Ok(cqe)
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

/// Most bytes [`Controller::admin_read`](crate::nvme::Controller::admin_read) transfers: PRP1's page plus one
/// PRP list page of 512 entries.
pub const MAX_ADMIN_READ: u64 = PAGE_SIZE * 513;
