//! The controller registers every NVMe wire has — CAP, VS, CC, CSTS — and
//! the handshakes on them: enable (CC.EN, then CSTS.RDY), disable (CC.EN
//! cleared, then CSTS.RDY = 0) and shutdown (CC.SHN, then CSTS.SHST),
//! each bounded. How a register is reached is the wire's
//! ([`Registers`]): an MMIO access in BAR0 over PCIe, a Property Get or
//! Set command over a fabric.

use std::time::{Duration, Instant};

use crate::core::error::{Error, Result};
use crate::nvme::spec::regs::{self, Cc, Csts};

/// Access to the controller registers of NVMe (offsets of
/// [`crate::nvme::spec::regs`], which fabrics' properties share).
pub(in crate::nvme) trait Registers {
    /// Read the 32-bit register at `offset`.
    fn read32(&mut self, offset: usize) -> Result<u32>;
    /// Write the 32-bit register at `offset`.
    fn write32(&mut self, offset: usize, value: u32) -> Result<()>;
    /// How long to wait between two reads of CSTS in a handshake (a read
    /// over a fabric is a command round trip; over PCIe one MMIO load).
    fn pause(&self) -> Duration;
}

/// Read CSTS: [`Error::DeviceGone`] if it reads all ones (a removed device).
pub(in crate::nvme) fn read_csts(r: &mut impl Registers) -> Result<Csts> {
    let c = Csts(r.read32(regs::CSTS)?);
    if c.is_all_ones() {
        return Err(Error::DeviceGone);
    }
    Ok(c)
}

/// Read CSTS until `done(csts)`, or `timeout`; with `check_cfs`, CSTS.CFS
/// first is [`Error::ControllerFatal`].
pub(in crate::nvme) fn wait_csts(
    r: &mut impl Registers,
    timeout: Duration,
    what: &'static str,
    check_cfs: bool,
    done: impl Fn(Csts) -> bool,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let c = read_csts(r)?;
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
        std::thread::sleep(r.pause());
    }
}

/// The controller configuration written before CC.EN, at bring-up and after
/// every reset alike, on every wire: NVM command set, 4 KiB pages (MPS 0),
/// round-robin arbitration, 64-byte SQEs and 16-byte CQEs.
pub(in crate::nvme) fn io_config() -> Cc {
    Cc::new()
        .css(Cc::CSS_NVM)
        .mps(0)
        .ams(Cc::AMS_ROUND_ROBIN)
        .iosqes(6)
        .iocqes(4)
}

/// Enable: write the configuration ([`io_config`]), then set CC.EN and
/// wait for CSTS.RDY = 1, bounded by `ready_timeout` (CAP.TO). CSTS.CFS
/// meanwhile is [`Error::ControllerFatal`].
pub(in crate::nvme) fn enable(r: &mut impl Registers, ready_timeout: Duration) -> Result<()> {
    let cc = io_config();
    r.write32(regs::CC, cc.0)?;
    r.write32(regs::CC, cc.enable().0)?;
    wait_csts(r, ready_timeout, "become ready (CSTS.RDY=1)", true, |c| {
        c.rdy()
    })
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
pub(in crate::nvme) fn disable(r: &mut impl Registers, timeout: Duration) -> Result<()> {
    let cc = Cc(r.read32(regs::CC)?);
    if cc.0 == u32::MAX {
        return Err(Error::DeviceGone);
    }
    let mut settled = Ok(());
    if cc.enabled() {
        let c = read_csts(r)?;
        if !c.rdy() && !c.cfs() {
            settled = wait_csts(r, timeout, READY_BEFORE_DISABLE, false, |c| {
                c.rdy() || c.cfs()
            });
            if let Err(Error::DeviceGone) = settled {
                return settled;
            }
        }
        r.write32(regs::CC, cc.disable().0)?;
    }
    wait_csts(r, timeout, "become disabled (CSTS.RDY=0)", false, |c| {
        !c.rdy()
    })?;
    settled
}

/// Whether the outcome of [`disable`] lets memory the controller was given
/// be freed.
pub(in crate::nvme) fn quiesced(r: &Result<()>) -> bool {
    matches!(r, Ok(()) | Err(Error::DeviceGone))
}

/// Normal shutdown of an enabled, ready and healthy controller: CC.SHN =
/// normal, then wait for CSTS.SHST = complete, bounded by `timeout`.
/// Returns `Ok(false)` without writing anything when the controller is
/// not in that state (disabled, fatal — which does not process a shutdown
/// — or gone), `Ok(true)` when the shutdown completed.
pub(in crate::nvme) fn shutdown(r: &mut impl Registers, timeout: Duration) -> Result<bool> {
    let cc = Cc(r.read32(regs::CC)?);
    let csts = read_csts(r)?;
    if cc.0 == u32::MAX || !cc.enabled() || !csts.rdy() || csts.cfs() {
        return Ok(false);
    }
    r.write32(regs::CC, cc.shn(Cc::SHN_NORMAL).0)?;
    wait_csts(r, timeout, "complete shutdown (CSTS.SHST)", false, |c| {
        c.shst() == Csts::SHST_COMPLETE
    })?;
    Ok(true)
}
