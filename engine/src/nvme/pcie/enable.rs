//! Controller registers in BAR0: CSTS reads and waits, enable
//! configuration (CC), disabling, and the checks that doorbells lie inside
//! BAR0.

use std::ptr::NonNull;
use std::time::{Duration, Instant};

use mcqio_vfio::Mmio;

use crate::core::error::{Error, Result};
use crate::nvme::ctrl::Controller;
use crate::nvme::spec::regs::{self, Cc, Csts};

/// BAR base pointer. `Send + Sync`: it is only used to compute doorbell
/// addresses; stores through it are volatile and made by queue owners.
#[derive(Copy, Clone)]
pub(in crate::nvme) struct BarPtr(pub(in crate::nvme) NonNull<u8>);
// SAFETY: the pointer is an address into the BAR mapping owned by the
// backend (kept alive by the controller); sharing the address is harmless,
// and every access through it is a volatile MMIO access.
unsafe impl Send for BarPtr {}
// SAFETY: see Send.
unsafe impl Sync for BarPtr {}

pub(in crate::nvme) fn read_csts(regs: &dyn Mmio) -> Result<Csts> {
    let c = Csts(regs.read32(regs::CSTS));
    if c.is_all_ones() {
        return Err(Error::DeviceGone);
    }
    Ok(c)
}

/// Spin (then yield) until `done(csts)` or `timeout`.
pub(in crate::nvme) fn wait_csts(
    regs: &dyn Mmio,
    timeout: Duration,
    what: &'static str,
    check_cfs: bool,
    done: impl Fn(Csts) -> bool,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let c = read_csts(regs)?;
        if done(c) {
            return Ok(());
        }
        if check_cfs && c.cfs() {
            return Err(Error::ControllerFatal);
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                what,
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// What [`disable`] reports when an enable in progress never completed
/// (returned only once the controller did read RDY = 0 afterwards).
pub(in crate::nvme) const READY_BEFORE_DISABLE: &str =
    "become ready before being disabled (CSTS.RDY=1)";

/// Disable the controller: clear CC.EN and wait for CSTS.RDY = 0, bounded
/// by `timeout` (CAP.TO). `Ok` means the controller reached the disabled
/// state, so it no longer accesses host memory; `Err(Error::DeviceGone)`
/// means the registers read all ones (a removed device cannot DMA either).
/// Any other `Err` means the device might still access memory it was
/// given: the caller must leak that memory rather than free it.
///
/// Clearing EN while EN = 1 and RDY = 0 (an enable still in progress) is
/// undefined in the spec, so that state first waits for RDY = 1 (or CFS),
/// bounded by the same timeout, as SPDK does. If RDY never comes, EN is
/// cleared anyway (nothing better is left to try), but the result is an
/// error: whether the controller really stopped cannot be known.
pub(in crate::nvme) fn disable(regs: &dyn Mmio, timeout: Duration) -> Result<()> {
    let cc = Cc(regs.read32(regs::CC));
    if cc.0 == u32::MAX {
        return Err(Error::DeviceGone);
    }
    let mut settled = Ok(());
    if cc.enabled() {
        let c = read_csts(regs)?;
        if !c.rdy() && !c.cfs() {
            settled = wait_csts(regs, timeout, READY_BEFORE_DISABLE, false, |c| {
                c.rdy() || c.cfs()
            });
            if let Err(Error::DeviceGone) = settled {
                return settled;
            }
        }
        regs.write32(regs::CC, cc.disable().0);
    }
    wait_csts(regs, timeout, "become disabled (CSTS.RDY=0)", false, |c| {
        !c.rdy()
    })?;
    settled
}

/// Whether the outcome of [`disable`] lets memory the controller was given
/// be freed.
pub(in crate::nvme) fn quiesced(r: &Result<()>) -> bool {
    matches!(r, Ok(()) | Err(Error::DeviceGone))
}

/// Whether both doorbells of queue `qid` lie inside a BAR of `bar_len` bytes.
pub(in crate::nvme) fn doorbells_fit(qid: u16, dstrd: u8, bar_len: usize) -> bool {
    regs::cq_head_doorbell(qid, dstrd)
        .checked_add(4)
        .is_some_and(|end| end <= bar_len)
}

/// The controller configuration written before CC.EN, at bring-up and after
/// every reset alike: NVM command set, 4 KiB pages (MPS 0), round-robin
/// arbitration, 64-byte SQEs and 16-byte CQEs.
pub(in crate::nvme) fn io_config() -> Cc {
    Cc::new()
        .css(Cc::CSS_NVM)
        .mps(0)
        .ams(Cc::AMS_ROUND_ROBIN)
        .iosqes(6)
        .iocqes(4)
}

impl Controller {
    pub(crate) fn bar(&self) -> NonNull<u8> {
        self.bar.0
    }
}
