//! Memory barriers and MMIO accessors between the CPU and a DMA device, one
//! function per ordering rule the NVMe driver needs, with the right
//! instruction per architecture.
//!
//! Why not `std::sync::atomic::fence`: Rust's fences order memory for other
//! *CPU threads*, the inner-shareable domain. On aarch64 `fence(Release)` is
//! `dmb ish` and `fence(Acquire)` is `dmb ishld`; neither orders normal-memory
//! stores (an SQE) before a store to Device memory (a BAR doorbell) as seen by
//! a PCIe device, which sits in the outer-shareable domain. Linux uses the
//! `dma_*mb()` family there (`dmb osh*`) and builds it into `writel`/`readl`.
//! On x86_64 every one of these orders is already given by TSO and by the
//! strong ordering of uncached MMIO, so they cost nothing but a compiler
//! barrier; the two exceptions are a store→load order ([`store_then_load`],
//! MFENCE) and non-temporal stores ([`drain_streaming_stores`], SFENCE).
//!
//! | function | orders | aarch64 | x86_64 | Linux |
//! |---|---|---|---|---|
//! | [`stores_before_doorbell`] | ring/PRP/shadow stores → doorbell store | `dmb oshst` | compiler | `dma_wmb()`, the barrier inside arm64 `writel` |
//! | [`loads_before_doorbell`] | consumed-CQE loads → CQ head doorbell store | `dmb oshld` | compiler | `dma_rmb()` |
//! | [`loads_after_phase`] | phase-bit load → CQE body and data loads | `dmb oshld` | compiler | `dma_rmb()` in `nvme_poll_cq` |
//! | [`store_then_load`] | shadow doorbell store → EventIdx load | `dmb osh` | `mfence` | `mb()` in `nvme_dbbuf_update_and_check_event` |
//! | [`drain_streaming_stores`] (x86_64) | non-temporal SQE stores → later stores | — | `sfence` | `wmb()` (SFENCE) after `movnt` copies |
//! | [`mmio_write32`] | earlier memory accesses → register store | `dmb oshst; str` | compiler; `mov` | `writel` |
//! | [`mmio_read32`] | register load → later loads | `ldr; dmb oshld` | `mov`; compiler | `readl` |
//! | [`mmio_write32_relaxed`] | nothing (the caller issued the barrier) | `str` | `mov` | `writel_relaxed` |
//!
//! On aarch64 the register accesses are single `ldr`/`str` instructions with
//! a plain base register (no writeback, no pair), written in `asm!` so the
//! compiler cannot pick another form: a hypervisor that traps the access (a
//! BAR emulated by QEMU under KVM) can only decode those from the fault
//! syndrome, which is why Linux's `__raw_writel` is assembly too.
//!
//! Every other architecture is a compile error until its barriers are
//! written and checked the same way.

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "mcqio-vfio: no DMA barriers for this architecture; add them to vfio/src/barrier.rs \
     (see the table there) before building for it"
);

#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{compiler_fence, fence, Ordering};

// The aarch64 instruction of each rule, written once: the `asm!` that emits
// it and the constant in [`insn`] (which the tests check) expand the same
// macro.
#[cfg(target_arch = "aarch64")]
macro_rules! a64_stores_before_doorbell {
    () => {
        "dmb oshst"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! a64_loads_before_doorbell {
    () => {
        "dmb oshld"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! a64_loads_after_phase {
    () => {
        "dmb oshld"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! a64_store_then_load {
    () => {
        "dmb osh"
    };
}

/// Emit one barrier instruction that is also a compiler barrier (no `nomem`:
/// the compiler must assume it reads and writes memory, so no access moves
/// across it).
#[cfg(target_arch = "aarch64")]
macro_rules! dmb {
    ($insn:ident) => {
        // SAFETY: a DMB only orders memory accesses; it reads or writes no
        // memory or register the compiler knows about.
        unsafe { core::arch::asm!($insn!(), options(nostack, preserves_flags)) }
    };
}

/// The aarch64 instruction behind each barrier function, as emitted (for the
/// tests, and to compare with a disassembly).
#[cfg(target_arch = "aarch64")]
pub mod insn {
    /// [`super::stores_before_doorbell`].
    pub const STORES_BEFORE_DOORBELL: &str = a64_stores_before_doorbell!();
    /// [`super::loads_before_doorbell`].
    pub const LOADS_BEFORE_DOORBELL: &str = a64_loads_before_doorbell!();
    /// [`super::loads_after_phase`].
    pub const LOADS_AFTER_PHASE: &str = a64_loads_after_phase!();
    /// [`super::store_then_load`].
    pub const STORE_THEN_LOAD: &str = a64_store_then_load!();
}

/// Order every earlier store to DMA memory (SQEs, PRP lists, DSM ranges, a
/// shadow doorbell) before the doorbell store that follows, MMIO or shadow.
///
/// NVMe: the controller may fetch an entry as soon as it sees the new tail,
/// so the entry must be visible to it first. aarch64: `dmb oshst`, Linux's
/// `dma_wmb()`, which is exactly the barrier arm64's `writel` places before
/// its store (`__iowmb()`); it orders normal-memory stores before a
/// Device-memory store for observers in the outer-shareable domain (the
/// device). x86_64: stores are not reordered with other stores, WB or UC, so
/// only the compiler must be held back; non-temporal stores need
/// [`drain_streaming_stores`] first.
#[inline(always)]
pub fn stores_before_doorbell() {
    #[cfg(target_arch = "aarch64")]
    dmb!(a64_stores_before_doorbell);
    #[cfg(target_arch = "x86_64")]
    compiler_fence(Ordering::SeqCst);
}

/// Order every earlier load from DMA memory (the CQEs just consumed) before
/// the CQ head doorbell store that follows.
///
/// NVMe: a head doorbell frees the consumed slots, and the controller may
/// overwrite them at once; our reads of them must be complete by then.
/// aarch64: `dmb oshld` (Linux's `dma_rmb()`), which orders earlier loads
/// before later loads *and stores*. (Linux's `writel` alone gives only
/// `dma_wmb()`, store→store; we do not rely on the CQE loads having retired.)
/// x86_64: loads are not reordered with later stores; compiler barrier only.
#[inline(always)]
pub fn loads_before_doorbell() {
    #[cfg(target_arch = "aarch64")]
    dmb!(a64_loads_before_doorbell);
    #[cfg(target_arch = "x86_64")]
    compiler_fence(Ordering::SeqCst);
}

/// Order the load that saw a new completion (CQE phase bit, or a tail
/// pointer) before the loads of the rest of the entry and of the data the
/// device wrote into the command's buffer.
///
/// NVMe: the controller writes the data, then the CQE, phase bit last, and
/// the host must not read the entry's other fields before the phase. aarch64:
/// `dmb oshld`, Linux's `dma_rmb()` in its CQ poll loop ("load-load control
/// dependency between phase and the rest of the cqe requires a full read
/// memory barrier"). x86_64: loads are not reordered with other loads, and
/// device writes to WB memory become visible in order; compiler barrier only.
#[inline(always)]
pub fn loads_after_phase() {
    #[cfg(target_arch = "aarch64")]
    dmb!(a64_loads_after_phase);
    #[cfg(target_arch = "x86_64")]
    compiler_fence(Ordering::SeqCst);
}

/// The shadow-doorbell EventIdx rule: order the store of the new value into
/// the shadow doorbell before the load of the controller's EventIdx.
///
/// NVMe Doorbell Buffer Config (and virtio's event index): the host stores
/// the shadow value, then reads EventIdx to decide whether an MMIO write is
/// still needed; the controller stores EventIdx, then reads the shadow. With
/// store→load reordering on both sides each could miss the other's update
/// and the new entries would sit unseen. This is the one order that needs a
/// full barrier: x86_64 MFENCE (TSO lets a load pass an earlier store);
/// aarch64 `dmb osh` (Linux's `dma_mb()`), a full barrier for the
/// outer-shareable domain. Linux's NVMe driver uses `mb()` (`dsb sy`) here;
/// both locations are normal memory and the device is an outer-shareable
/// observer, so the DMB already gives the order and the DSB's extra wait for
/// completion buys nothing.
#[inline(always)]
pub fn store_then_load() {
    #[cfg(target_arch = "aarch64")]
    dmb!(a64_store_then_load);
    #[cfg(target_arch = "x86_64")]
    fence(Ordering::SeqCst);
}

/// Drain non-temporal (streaming) stores, which x86 does not order with
/// later stores, so that a following doorbell store cannot overtake them.
/// SFENCE, as Linux's `wmb()` after `movnt` copies. x86_64 only: other
/// architectures have no streaming SQE path.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn drain_streaming_stores() {
    // SAFETY: SFENCE only orders stores; SSE is in the x86_64 baseline.
    unsafe { std::arch::x86_64::_mm_sfence() };
}

/// Store a 32-bit device register with no barrier (Linux's
/// `writel_relaxed`): for doorbells, whose caller has issued
/// [`stores_before_doorbell`] or [`loads_before_doorbell`].
///
/// # Safety
///
/// `reg` must be valid for a 4-byte aligned volatile store for the duration
/// of the call (a register in a live BAR mapping, or memory standing in for
/// one), and no reference to that location may be live.
#[inline(always)]
pub unsafe fn mmio_write32_relaxed(reg: *mut u32, value: u32) {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: the caller guarantees `reg` is valid and aligned for a 32-bit
    // store; one `str` with a plain base register (a single-copy atomic,
    // trap-decodable access) and no other effect.
    unsafe {
        core::arch::asm!("str {v:w}, [{p}]", v = in(reg) value, p = in(reg) reg,
            options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees `reg` is valid and aligned; a volatile
    // store is one `mov` and forms no reference.
    unsafe {
        reg.write_volatile(value)
    };
}

/// Store a 32-bit device register after all earlier memory accesses (Linux's
/// `writel`): configuration registers such as AQA/ASQ/ACQ and CC, which must
/// not reach the controller before the queue memory they describe.
/// aarch64: `dmb oshst; str` (see [`stores_before_doorbell`]); x86_64: a
/// UC store is ordered after earlier stores; compiler barrier and `mov`.
///
/// # Safety
///
/// As for [`mmio_write32_relaxed`].
#[inline(always)]
pub unsafe fn mmio_write32(reg: *mut u32, value: u32) {
    stores_before_doorbell();
    // SAFETY: forwarded from this function's contract.
    unsafe { mmio_write32_relaxed(reg, value) };
}

/// Load a 32-bit device register, ordered before every later load (Linux's
/// `readl`): a status read (CSTS.RDY, say) that gates reads of DMA memory
/// must not be overtaken by them. aarch64: `ldr; dmb oshld`; x86_64: UC loads
/// are not reordered with later loads; `mov` and compiler barrier. (Linux's
/// `readl` also adds a fake control dependency so that a following
/// counter-based `udelay()` waits for the load; mcqio times with the OS clock
/// after a syscall-free loop and needs no such thing.)
///
/// # Safety
///
/// `reg` must be valid for a 4-byte aligned volatile load for the duration
/// of the call, with no live `&mut` to that location.
#[inline(always)]
pub unsafe fn mmio_read32(reg: *const u32) -> u32 {
    #[cfg(target_arch = "aarch64")]
    let value = {
        let v: u32;
        // SAFETY: the caller guarantees `reg` is valid and aligned for a
        // 32-bit load; one `ldr` with a plain base register, no other effect.
        unsafe {
            core::arch::asm!("ldr {v:w}, [{p}]", v = out(reg) v, p = in(reg) reg,
                options(nostack, preserves_flags))
        };
        dmb!(a64_loads_after_phase);
        v
    };
    #[cfg(target_arch = "x86_64")]
    let value = {
        // SAFETY: the caller guarantees `reg` is valid and aligned; volatile
        // load, no reference formed.
        let v = unsafe { reg.read_volatile() };
        compiler_fence(Ordering::SeqCst);
        v
    };
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module offers the same ordering rules on every supported
    /// architecture (this fails to compile if one goes missing), plus the
    /// x86-only SFENCE for streaming stores.
    #[test]
    fn every_rule_exists_on_this_arch() {
        let rules: [(&str, fn()); 4] = [
            ("stores_before_doorbell", stores_before_doorbell),
            ("loads_before_doorbell", loads_before_doorbell),
            ("loads_after_phase", loads_after_phase),
            ("store_then_load", store_then_load),
        ];
        for (_, f) in rules {
            f();
        }
        #[cfg(target_arch = "x86_64")]
        {
            let f: fn() = drain_streaming_stores;
            f();
        }
        let _: unsafe fn(*mut u32, u32) = mmio_write32;
        let _: unsafe fn(*mut u32, u32) = mmio_write32_relaxed;
        let _: unsafe fn(*const u32) -> u32 = mmio_read32;
    }

    /// On aarch64 every device-facing barrier is outer-shareable (`osh`):
    /// an inner-shareable `dmb ish*` (what `std::sync::atomic::fence` emits)
    /// does not order accesses for a PCIe device. The store barrier orders
    /// stores, the completion barriers order loads, the EventIdx barrier is
    /// full.
    #[test]
    #[cfg(target_arch = "aarch64")]
    fn aarch64_barriers_are_outer_shareable() {
        assert_eq!(insn::STORES_BEFORE_DOORBELL, "dmb oshst");
        assert_eq!(insn::LOADS_BEFORE_DOORBELL, "dmb oshld");
        assert_eq!(insn::LOADS_AFTER_PHASE, "dmb oshld");
        assert_eq!(insn::STORE_THEN_LOAD, "dmb osh");
    }

    /// The accessors hit exactly the addressed 32-bit word.
    #[test]
    fn mmio_accessors_round_trip() {
        let mut words = [0u32; 4];
        let p = words.as_mut_ptr();
        // SAFETY: `p.add(1)`/`p.add(2)` are aligned words of the live local
        // array, and no reference to it is live while the raw accesses run.
        unsafe {
            mmio_write32(p.add(1), 0xDEAD_BEEF);
            mmio_write32_relaxed(p.add(2), 7);
            assert_eq!(mmio_read32(p.add(1)), 0xDEAD_BEEF);
            assert_eq!(mmio_read32(p.add(2)), 7);
        }
        assert_eq!(words, [0, 0xDEAD_BEEF, 7, 0]);
    }
}
