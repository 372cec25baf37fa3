//! BAR0 of an NVMe controller over PCIe: its registers as the NVMe
//! layer's [`Registers`] (one MMIO access each), the BAR's base address
//! for doorbells, and the check that a queue's doorbells lie inside it.

use std::ptr::NonNull;
use std::time::Duration;

use mcqio_vfio::Mmio;

use crate::core::error::Result;
use crate::nvme::host::regs::Registers;
use crate::nvme::spec::regs;

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

/// The registers in BAR0, reached by MMIO.
pub(in crate::nvme) struct Bar<'a>(pub(in crate::nvme) &'a dyn Mmio);

impl Registers for Bar<'_> {
    fn read32(&mut self, offset: usize) -> Result<u32> {
        Ok(self.0.read32(offset))
    }

    fn write32(&mut self, offset: usize, value: u32) -> Result<()> {
        self.0.write32(offset, value);
        Ok(())
    }

    fn pause(&self) -> Duration {
        Duration::from_micros(50)
    }
}

/// Whether both doorbells of queue `qid` lie inside a BAR of `bar_len` bytes.
pub(in crate::nvme) fn doorbells_fit(qid: u16, dstrd: u8, bar_len: usize) -> bool {
    regs::cq_head_doorbell(qid, dstrd)
        .checked_add(4)
        .is_some_and(|end| end <= bar_len)
}
