//! Controller register block (BAR0) and its bitfields.
//!
//! Registers are read once into a newtype ([`Cap`], [`Csts`], ...) and the
//! local copy is decoded through named accessors, so the spec's bit
//! positions live in exactly one place. Writes are built from named
//! constants (`Cc::new().enable().iosqes(6)`), never magic numbers.

/// Controller Capabilities (64-bit).
pub const CAP: usize = 0x00;
/// Version (32-bit).
pub const VS: usize = 0x08;
/// Interrupt Mask Set.
pub const INTMS: usize = 0x0C;
/// Interrupt Mask Clear.
pub const INTMC: usize = 0x10;
/// Controller Configuration.
pub const CC: usize = 0x14;
/// Controller Status.
pub const CSTS: usize = 0x1C;
/// NVM Subsystem Reset.
pub const NSSR: usize = 0x20;
/// Admin Queue Attributes.
pub const AQA: usize = 0x24;
/// Admin Submission Queue base address (64-bit).
pub const ASQ: usize = 0x28;
/// Admin Completion Queue base address (64-bit).
pub const ACQ: usize = 0x30;
/// First doorbell (admin SQ tail).
pub const DOORBELL_BASE: usize = 0x1000;

/// Byte distance between consecutive doorbells for a CAP.DSTRD value.
#[inline]
pub const fn doorbell_stride(dstrd: u8) -> usize {
    4 << dstrd
}

/// BAR offset of the SQ tail doorbell of queue `qid`.
#[inline]
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    DOORBELL_BASE + (2 * qid as usize) * doorbell_stride(dstrd)
}

/// BAR offset of the CQ head doorbell of queue `qid`.
#[inline]
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    DOORBELL_BASE + (2 * qid as usize + 1) * doorbell_stride(dstrd)
}

/// Decoded CAP register.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum Queue Entries Supported, as a count (the register is 0's based).
    pub const fn max_queue_entries(self) -> u32 {
        (self.0 & 0xFFFF) as u32 + 1
    }
    /// Contiguous Queues Required.
    pub const fn cqr(self) -> bool {
        self.0 >> 16 & 1 == 1
    }
    /// Timeout: worst-case time to become ready, in 500 ms units.
    pub const fn to(self) -> u8 {
        (self.0 >> 24) as u8
    }
    /// CAP.TO as milliseconds.
    pub const fn timeout_ms(self) -> u64 {
        self.to() as u64 * 500
    }
    /// Doorbell Stride (doorbells are `4 << dstrd` bytes apart).
    pub const fn dstrd(self) -> u8 {
        (self.0 >> 32 & 0xF) as u8
    }
    /// NVM Subsystem Reset Supported.
    pub const fn nssrs(self) -> bool {
        self.0 >> 36 & 1 == 1
    }
    /// Command Sets Supported (bit 0: NVM command set).
    pub const fn css(self) -> u8 {
        (self.0 >> 37) as u8
    }
    /// Memory Page Size Minimum, as log2 of bytes (2^(12 + MPSMIN)).
    pub const fn mps_min_shift(self) -> u32 {
        12 + (self.0 >> 48 & 0xF) as u32
    }
    /// Memory Page Size Maximum, as log2 of bytes.
    pub const fn mps_max_shift(self) -> u32 {
        12 + (self.0 >> 52 & 0xF) as u32
    }
}

/// Controller Configuration register builder/decoder.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    /// Enable bit.
    pub const EN: u32 = 1 << 0;
    const CSS_SHIFT: u32 = 4;
    const MPS_SHIFT: u32 = 7;
    const AMS_SHIFT: u32 = 11;
    const SHN_SHIFT: u32 = 14;
    const SHN_MASK: u32 = 0b11 << Self::SHN_SHIFT;
    const IOSQES_SHIFT: u32 = 16;
    const IOCQES_SHIFT: u32 = 20;
    /// Shutdown notification: normal shutdown.
    pub const SHN_NORMAL: u32 = 0b01;
    /// Shutdown notification: abrupt shutdown.
    pub const SHN_ABRUPT: u32 = 0b10;
    /// CSS value selecting the NVM command set.
    pub const CSS_NVM: u32 = 0;
    /// AMS value selecting round-robin arbitration.
    pub const AMS_ROUND_ROBIN: u32 = 0;

    /// All-zero configuration.
    pub const fn new() -> Self {
        Cc(0)
    }
    /// Set EN.
    pub const fn enable(self) -> Self {
        Cc(self.0 | Self::EN)
    }
    /// Clear EN.
    pub const fn disable(self) -> Self {
        Cc(self.0 & !Self::EN)
    }
    /// Whether EN is set.
    pub const fn enabled(self) -> bool {
        self.0 & Self::EN != 0
    }
    /// I/O command set selected.
    pub const fn css(self, css: u32) -> Self {
        Cc(self.0 & !(0b111 << Self::CSS_SHIFT) | (css & 0b111) << Self::CSS_SHIFT)
    }
    /// Memory page size as 2^(12 + mps).
    pub const fn mps(self, mps: u32) -> Self {
        Cc(self.0 & !(0xF << Self::MPS_SHIFT) | (mps & 0xF) << Self::MPS_SHIFT)
    }
    /// Arbitration mechanism.
    pub const fn ams(self, ams: u32) -> Self {
        Cc(self.0 & !(0b111 << Self::AMS_SHIFT) | (ams & 0b111) << Self::AMS_SHIFT)
    }
    /// Shutdown notification field.
    pub const fn shn(self, shn: u32) -> Self {
        Cc(self.0 & !Self::SHN_MASK | (shn & 0b11) << Self::SHN_SHIFT)
    }
    /// I/O SQ entry size as log2 bytes (6 = 64 B).
    pub const fn iosqes(self, log2: u32) -> Self {
        Cc(self.0 & !(0xF << Self::IOSQES_SHIFT) | (log2 & 0xF) << Self::IOSQES_SHIFT)
    }
    /// I/O CQ entry size as log2 bytes (4 = 16 B).
    pub const fn iocqes(self, log2: u32) -> Self {
        Cc(self.0 & !(0xF << Self::IOCQES_SHIFT) | (log2 & 0xF) << Self::IOCQES_SHIFT)
    }
}

/// Decoded Controller Status register.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    /// Shutdown status: normal operation.
    pub const SHST_NORMAL: u32 = 0b00;
    /// Shutdown status: shutdown processing occurring.
    pub const SHST_OCCURRING: u32 = 0b01;
    /// Shutdown status: shutdown processing complete.
    pub const SHST_COMPLETE: u32 = 0b10;

    /// Ready.
    pub const fn rdy(self) -> bool {
        self.0 & 1 != 0
    }
    /// Controller Fatal Status.
    pub const fn cfs(self) -> bool {
        self.0 >> 1 & 1 != 0
    }
    /// Shutdown Status.
    pub const fn shst(self) -> u32 {
        self.0 >> 2 & 0b11
    }
    /// NVM Subsystem Reset Occurred.
    pub const fn nssro(self) -> bool {
        self.0 >> 4 & 1 != 0
    }
    /// Processing Paused.
    pub const fn pp(self) -> bool {
        self.0 >> 5 & 1 != 0
    }
    /// Whether the read returned all ones: the device is gone (surprise
    /// removal) or the BAR is not reachable.
    pub const fn is_all_ones(self) -> bool {
        self.0 == u32::MAX
    }
}

/// Admin Queue Attributes builder.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Aqa(pub u32);

impl Aqa {
    /// Admin queue sizes, as entry counts (written 0's based).
    pub const fn new(sq_entries: u16, cq_entries: u16) -> Self {
        Aqa(((sq_entries as u32 - 1) & 0xFFF) | ((cq_entries as u32 - 1) & 0xFFF) << 16)
    }
    /// Admin SQ size in entries.
    pub const fn sq_entries(self) -> u32 {
        (self.0 & 0xFFF) + 1
    }
    /// Admin CQ size in entries.
    pub const fn cq_entries(self) -> u32 {
        (self.0 >> 16 & 0xFFF) + 1
    }
}

/// Version register, decoded.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Version(pub u32);

impl Version {
    /// Major version.
    pub const fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// Minor version.
    pub const fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// Tertiary version.
    pub const fn tertiary(self) -> u8 {
        self.0 as u8
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.tertiary())
    }
}
