//! The host controller's interrupt, for queue pairs that wait on it
//! ([`crate::WaitPolicy`]).
//!
//! QEMU's UFS controller has one legacy INTx line (no MSI, no MSI-X), and
//! UFSHCI drives it from IS & IE. The first waiting queue pair routes it
//! to a [`Notifier`] through [`mcqio_vfio::Backend::interrupts`]; every
//! waiting queue pair shares that notifier (see `core::qpair::wait` on
//! shared notifiers). Before a wait sleeps, the queue acknowledges its
//! causes as the spec has a host do — the queue's CQIS (MCQ), then IS by
//! writing 1 to clear — enables them in IE (a host controller reset
//! clears IE), and unmasks the line, which VFIO masked when it fired. A
//! cause that stands after the unmask delivers again, so nothing set
//! between the acknowledgement and the sleep is lost.

use std::sync::Arc;

use mcqio_vfio::{IrqKind, Notifier};

use super::UfsController;
use crate::core::error::{Error, Result};
use crate::ufs::spec::regs::{self, is};

impl UfsController {
    /// The notifier of the controller's interrupt, routing it the first
    /// time (see the module docs).
    pub(crate) fn interrupt_line(&self) -> Result<Arc<Notifier>> {
        let no = |why: String| Error::InvalidOption(format!("waiting on interrupts: {why}"));
        let mut routed = self.irq.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = &*routed {
            return Ok(Arc::clone(n));
        }
        let name = self.backend.name();
        let irqs = self
            .backend
            .interrupts()
            .ok_or_else(|| no(format!("{name} has no interrupts")))?;
        if irqs.kind() == IrqKind::None {
            return Err(no(format!("{name} has no interrupt the host can use")));
        }
        let n = Arc::new(Notifier::new().map_err(|e| no(format!("eventfd: {e}")))?);
        irqs.route(std::slice::from_ref(&n))
            .map_err(|e| no(e.to_string()))?;
        log::info!("{name}: {:?} routed for waiting queue pairs", irqs.kind());
        *routed = Some(Arc::clone(&n));
        Ok(n)
    }

    /// Before a wait sleeps: acknowledge `cause` in IS (write 1 to clear),
    /// enable it in IE, and unmask the line (see the module docs).
    #[cold]
    pub(crate) fn arm_interrupt(&self, cause: u32) {
        let r = self.backend.regs();
        r.write32(regs::IS, cause);
        let ie = r.read32(regs::IE);
        if ie & cause != cause && ie != u32::MAX {
            r.write32(regs::IE, ie | cause);
        }
        if let Some(irqs) = self.backend.interrupts() {
            if let Err(e) = irqs.unmask() {
                log::warn!("{}: unmasking the interrupt: {e}", self.backend.name());
            }
        }
    }
}

/// The IS cause a queue's completions raise: IS.CQES for MCQ, IS.UTRCS for
/// the legacy list.
pub(crate) const fn completion_cause(mcq: bool) -> u32 {
    if mcq {
        is::CQES
    } else {
        is::UTRCS
    }
}
