//! The hardware seam between the engine and a controller.
//!
//! The engine drives a controller through three things: its register BAR
//! ([`Mmio`]), a DMA space ([`DmaSpace`]) and, for emulated devices that
//! process synchronously, a [`DoorbellHook`]; optionally a fourth, its
//! interrupts as eventfds ([`Interrupts`]). [`Backend`] bundles them. The
//! VFIO path (`crate::VfioBackend`) and the fake controller in
//! `mcqio-fixtures` both implement it, so the same driver code runs on both.
//!
//! Only bring-up and admin work goes through the `dyn` methods; the I/O path
//! rings doorbells with plain volatile stores to addresses computed once from
//! [`Mmio::base`], so there is no dynamic dispatch per I/O.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::dma::DmaSpace;
use crate::irq::Interrupts;

/// Register access to a memory-mapped BAR.
///
/// Reads and writes are volatile and naturally aligned. Offsets outside the
/// BAR are a programming error in the caller and panic.
pub trait Mmio: Send + Sync {
    /// Read a 32-bit register.
    fn read32(&self, offset: usize) -> u32;
    /// Write a 32-bit register.
    fn write32(&self, offset: usize, value: u32);
    /// Read a 64-bit register (as two 32-bit reads, low first, where the
    /// hardware requires it).
    fn read64(&self, offset: usize) -> u64 {
        let lo = self.read32(offset) as u64;
        let hi = self.read32(offset + 4) as u64;
        lo | (hi << 32)
    }
    /// Write a 64-bit register (low dword first).
    fn write64(&self, offset: usize, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
    /// Base of the mapping, for computing doorbell addresses once.
    ///
    /// The mapping stays valid as long as the `Mmio` object lives. Stores
    /// through it must be volatile, 32 bits wide and 4-byte aligned.
    fn base(&self) -> NonNull<u8>;
    /// Size of the mapping in bytes.
    fn len(&self) -> usize;
    /// Whether the mapping is empty (never, for a real BAR).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Notification after a doorbell store, for emulations that run the device
/// on the doorbell write (the fake controller's synchronous mode). Real
/// hardware and threaded emulation return no hook.
pub trait DoorbellHook: Send + Sync {
    /// The driver stored `value` at BAR offset `offset`.
    fn rung(&self, offset: usize, value: u32);
}

/// A controller the engine can drive.
pub trait Backend: Send + Sync {
    /// BAR0: the NVMe register block and doorbells.
    fn regs(&self) -> &dyn Mmio;
    /// Where DMA memory for queues, PRP lists and buffers comes from.
    fn dma(&self) -> &Arc<DmaSpace>;
    /// A hook to call after each doorbell store, if the device needs one.
    fn doorbell_hook(&self) -> Option<Arc<dyn DoorbellHook>> {
        None
    }
    /// A short human-readable name (`vfio:0000:00:02.0`, `fake`).
    fn name(&self) -> String;
    /// Interrupt delivery to eventfds, for waiting instead of polling;
    /// `None` where the device has none the host can use.
    fn interrupts(&self) -> Option<&dyn Interrupts> {
        None
    }
}
