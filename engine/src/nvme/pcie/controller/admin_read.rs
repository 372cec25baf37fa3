//! The admin entry points that return data or events:
//! [`Controller::admin_read`] (Identify, Get Log Page into memory of its
//! own) and the Asynchronous Events the admin rings collected.

use mcqio_vfio::DmaDir;

use super::{failure_error, Controller};
use crate::core::error::{Error, Result};
use crate::nvme::pcie::admin::{AsyncEvent, MAX_ADMIN_READ};
use crate::nvme::pcie::queue::PAGE_SIZE;
use crate::nvme::spec::identify::IDENTIFY_LEN;
use crate::nvme::spec::opcodes::admin as admin_op;
use crate::nvme::spec::{Cqe, Sqe};

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
        self.link
            .admin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .aers as usize
    }
}
