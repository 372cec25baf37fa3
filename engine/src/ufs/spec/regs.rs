//! UFSHCI 4.0 host-controller registers (BAR0), little-endian, 32-bit.
//!
//! As for NVMe (`crate::nvme::spec::regs`), a register is read once into a
//! newtype and decoded through named accessors; writes are built from named
//! constants. The MCQ registers come in three groups:
//!
//! 1. the capability word [`MCQCAP`] (number of queues, where the
//!    configuration array starts),
//! 2. one 0x40-byte configuration block per queue ([`QueueConfig`]:
//!    SQATTR/SQLBA/SQUBA/SQDAO/SQISAO, CQATTR/CQLBA/CQUBA/CQDAO/CQISAO),
//! 3. the operational registers each block points at through its `*DAO` /
//!    `*ISAO` offsets ([`sq_op`], [`cq_op`], [`cq_int`]). Controllers may
//!    fix those offsets and ignore writes (QEMU does): a driver reads them
//!    back after writing and uses what it reads.

/// Host Controller Capabilities.
pub const CAP: usize = 0x00;
/// MCQ Capabilities (UFSHCI 4.0).
pub const MCQCAP: usize = 0x04;
/// UFSHCI version.
pub const VER: usize = 0x08;
/// Host Controller Product ID.
pub const HCPID: usize = 0x10;
/// Host Controller Manufacturer ID.
pub const HCMID: usize = 0x14;
/// Auto-Hibernate Idle Timer.
pub const AHIT: usize = 0x18;
/// Interrupt Status (write 1 to clear).
pub const IS: usize = 0x20;
/// Interrupt Enable.
pub const IE: usize = 0x24;
/// Host Controller Status.
pub const HCS: usize = 0x30;
/// Host Controller Enable.
pub const HCE: usize = 0x34;
/// UTP Transfer Request List Base Address (low), legacy single doorbell.
pub const UTRLBA: usize = 0x50;
/// UTP Transfer Request List Base Address (high).
pub const UTRLBAU: usize = 0x54;
/// UTP Transfer Request List Door Bell (one bit per slot).
pub const UTRLDBR: usize = 0x58;
/// UTP Transfer Request List Clear (write 0 to a slot's bit to clear it).
pub const UTRLCLR: usize = 0x5C;
/// UTP Transfer Request List Run-Stop (1 = run).
pub const UTRLRSR: usize = 0x60;
/// UTP Transfer Request List Completion Notification (write 1 to clear).
pub const UTRLCNR: usize = 0x64;
/// UTP Task Management Request List Base Address (low).
pub const UTMRLBA: usize = 0x70;
/// UTP Task Management Request List Base Address (high).
pub const UTMRLBAU: usize = 0x74;
/// UTP Task Management Request List Door Bell.
pub const UTMRLDBR: usize = 0x78;
/// UTP Task Management Request List Run-Stop.
pub const UTMRLRSR: usize = 0x80;
/// UIC Command.
pub const UICCMD: usize = 0x90;
/// UIC Command Argument 1 (attribute id << 16 | selector).
pub const UCMDARG1: usize = 0x94;
/// UIC Command Argument 2 (attribute set type; result code in bits 7:0).
pub const UCMDARG2: usize = 0x98;
/// UIC Command Argument 3 (attribute value).
pub const UCMDARG3: usize = 0x9C;
/// Memory configuration: selects MCQ mode (Linux `REG_UFS_MEM_CFG`).
pub const MEM_CFG: usize = 0x300;
/// MCQ configuration: maximum active commands (Linux `REG_UFS_MCQ_CFG`).
pub const MCQ_CFG: usize = 0x380;

/// Decoded CAP register.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Cap(pub u32);

impl Cap {
    /// Transfer request slots in legacy single-doorbell mode (NUTRS, 0-based
    /// in bits 4:0): at most 32.
    pub const fn sdb_slots(self) -> u32 {
        (self.0 & 0x1F) + 1
    }
    /// Maximum active commands in MCQ mode (bits 7:0, 0-based): at most 256.
    pub const fn mcq_mac(self) -> u32 {
        (self.0 & 0xFF) + 1
    }
    /// Outstanding ready-to-transfer requests supported (NORTT, 0-based).
    pub const fn nortt(self) -> u32 {
        (self.0 >> 8 & 0xFF) + 1
    }
    /// Task management request slots (NUTMRS, 0-based).
    pub const fn tm_slots(self) -> u32 {
        (self.0 >> 16 & 0x7) + 1
    }
    /// 64-bit addressing supported (64AS).
    pub const fn addr64(self) -> bool {
        self.0 >> 24 & 1 == 1
    }
    /// Multi-circular queue supported (MCQS).
    pub const fn mcq(self) -> bool {
        self.0 >> 30 & 1 == 1
    }
}

/// Decoded MCQCAP register.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct McqCap(pub u32);

impl McqCap {
    /// Number of hardware queues (MAXQ, 0-based in bits 7:0): 1..=256.
    pub const fn max_queues(self) -> u32 {
        (self.0 & 0xFF) + 1
    }
    /// Round-robin arbitration supported (RRP).
    pub const fn round_robin(self) -> bool {
        self.0 >> 9 & 1 == 1
    }
    /// Extended interrupt id supported (EIS).
    pub const fn ext_iid(self) -> bool {
        self.0 >> 10 & 1 == 1
    }
    /// Byte offset of the queue configuration array (QCFGPTR × 0x200).
    pub const fn config_offset(self) -> usize {
        ((self.0 >> 16 & 0xFF) as usize) * 0x200
    }
}

/// Decoded VER register.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Ver(pub u32);

impl Ver {
    /// Major version (bits 15:8).
    pub const fn major(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// Minor (bits 7:4) and version suffix (bits 3:0).
    pub const fn minor(self) -> u8 {
        (self.0 >> 4 & 0xF) as u8
    }
}

/// IS / IE bits.
pub mod is {
    /// UTP transfer request completion (legacy doorbell mode).
    pub const UTRCS: u32 = 1 << 0;
    /// UIC error.
    pub const UE: u32 = 1 << 2;
    /// UIC link lost.
    pub const ULLS: u32 = 1 << 7;
    /// UTP task management request completion.
    pub const UTMRCS: u32 = 1 << 9;
    /// UIC command completion.
    pub const UCCS: u32 = 1 << 10;
    /// Device fatal error.
    pub const DFES: u32 = 1 << 11;
    /// UTP error.
    pub const UTPES: u32 = 1 << 12;
    /// Host controller fatal error.
    pub const HCFES: u32 = 1 << 16;
    /// System bus fatal error.
    pub const SBFES: u32 = 1 << 17;
    /// Some completion queue has an event (MCQ).
    pub const CQES: u32 = 1 << 20;
    /// Every bit that means the controller or the link needs a reset.
    pub const FATAL: u32 = UE | ULLS | DFES | UTPES | HCFES | SBFES;
}

/// Decoded HCS register.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Hcs(pub u32);

impl Hcs {
    /// Device present (DP).
    pub const fn device_present(self) -> bool {
        self.0 & 1 == 1
    }
    /// The transfer request list is ready (UTRLRDY).
    pub const fn utrl_ready(self) -> bool {
        self.0 >> 1 & 1 == 1
    }
    /// The task management list is ready (UTMRLRDY).
    pub const fn utmrl_ready(self) -> bool {
        self.0 >> 2 & 1 == 1
    }
    /// The UIC command registers accept a command (UCRDY).
    pub const fn uic_ready(self) -> bool {
        self.0 >> 3 & 1 == 1
    }
}

/// HCE bit 0: host controller enable.
pub const HCE_ENABLE: u32 = 1;

/// MEM_CFG bit 0: run the transfer queues in MCQ mode.
pub const MEM_CFG_MCQ_MODE: u32 = 1 << 0;
/// MEM_CFG bit 1: extended (MSI) interrupts enable.
pub const MEM_CFG_ESI: u32 = 1 << 1;

/// MCQ_CFG with the maximum number of active commands `mac` (1..=512;
/// the field, bits 16:8, holds `mac - 1`). QEMU implements bits 15:8 only.
pub const fn mcq_cfg_mac(mac: u32) -> u32 {
    ((mac - 1) & 0x1FF) << 8
}

/// UIC (UniPro) commands written to [`UICCMD`].
pub mod uic {
    /// Read a local attribute.
    pub const DME_GET: u32 = 0x01;
    /// Write a local attribute.
    pub const DME_SET: u32 = 0x02;
    /// Read a peer (device) attribute.
    pub const DME_PEER_GET: u32 = 0x03;
    /// Write a peer attribute.
    pub const DME_PEER_SET: u32 = 0x04;
    /// Reset the UniPro stack.
    pub const DME_RESET: u32 = 0x14;
    /// Bring the link up.
    pub const DME_LINKSTARTUP: u32 = 0x16;
    /// Enter hibernate.
    pub const DME_HIBER_ENTER: u32 = 0x17;
    /// Leave hibernate.
    pub const DME_HIBER_EXIT: u32 = 0x18;
    /// UCMDARG2 bits 7:0: the command's result code (0 = success).
    pub const fn result(arg2: u32) -> u8 {
        arg2 as u8
    }
}

/// Size of one queue's configuration block.
pub const QCFG_SIZE: usize = 0x40;

/// Register offsets inside one queue's configuration block.
pub mod qcfg {
    /// SQ attributes ([`super::QueueAttr`]).
    pub const SQATTR: usize = 0x00;
    /// SQ base address, low 32 bits.
    pub const SQLBA: usize = 0x04;
    /// SQ base address, high 32 bits.
    pub const SQUBA: usize = 0x08;
    /// Offset of the SQ doorbell block ([`super::sq_op`]) from BAR0.
    pub const SQDAO: usize = 0x0C;
    /// Offset of the SQ interrupt-status block from BAR0.
    pub const SQISAO: usize = 0x10;
    /// CQ attributes ([`super::QueueAttr`]).
    pub const CQATTR: usize = 0x20;
    /// CQ base address, low 32 bits.
    pub const CQLBA: usize = 0x24;
    /// CQ base address, high 32 bits.
    pub const CQUBA: usize = 0x28;
    /// Offset of the CQ doorbell block ([`super::cq_op`]) from BAR0.
    pub const CQDAO: usize = 0x2C;
    /// Offset of the CQ interrupt-status block ([`super::cq_int`]) from BAR0.
    pub const CQISAO: usize = 0x30;
}

/// Where queue `i`'s configuration block lives, from MCQCAP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// BAR0 offset of the block.
    pub base: usize,
}

impl QueueConfig {
    /// Block of queue `i` (callers check `i < max_queues` and the BAR length).
    pub const fn new(cap: McqCap, i: u32) -> Self {
        QueueConfig {
            base: cap.config_offset() + QCFG_SIZE * i as usize,
        }
    }
    /// BAR0 offset of register `reg` ([`qcfg`]) in this block.
    pub const fn reg(self, reg: usize) -> usize {
        self.base + reg
    }
}

/// SQATTR / CQATTR value.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QueueAttr(pub u32);

impl QueueAttr {
    /// Bit 31: the queue is enabled.
    pub const ENABLE: u32 = 1 << 31;

    /// An enabled queue of `entries` 32-byte entries (SIZE = dwords − 1),
    /// bound to completion queue `cqid` (SQATTR only; 0 for CQATTR).
    pub const fn enabled(entries: u16, cqid: u8) -> Self {
        QueueAttr(Self::ENABLE | (cqid as u32) << 16 | (entries as u32 * 8 - 1))
    }
    /// Number of 32-byte entries.
    pub const fn entries(self) -> u32 {
        ((self.0 & 0xFFFF) + 1) / 8
    }
    /// The completion queue an SQ posts to.
    pub const fn cqid(self) -> u8 {
        (self.0 >> 16) as u8
    }
    /// Whether the queue is enabled.
    pub const fn is_enabled(self) -> bool {
        self.0 & Self::ENABLE != 0
    }
}

/// Registers of the SQ doorbell block (offsets from SQDAO).
pub mod sq_op {
    /// SQ head, byte offset into the ring (read-only for the host).
    pub const SQHP: usize = 0x00;
    /// SQ tail, byte offset into the ring: writing it is the doorbell.
    pub const SQTP: usize = 0x04;
    /// Run-time control ([`RTC_START`], [`RTC_STOP`], [`RTC_ICU`]).
    pub const SQRTC: usize = 0x08;
    /// Cleanup target: the nexus `lun << 8 | task tag` (IID in bits 31:24).
    pub const SQCTI: usize = 0x0C;
    /// Run-time status ([`RTS_STOPPED`], [`RTS_CLEANUP_DONE`]).
    pub const SQRTS: usize = 0x10;
    /// Start fetching.
    pub const RTC_START: u32 = 0x0;
    /// Stop fetching (the controller finishes the entry it holds).
    pub const RTC_STOP: u32 = 0x1;
    /// Initiate cleanup of the command named in SQCTI.
    pub const RTC_ICU: u32 = 0x2;
    /// SQRTS: the queue is stopped.
    pub const RTS_STOPPED: u32 = 1 << 0;
    /// SQRTS: the cleanup finished.
    pub const RTS_CLEANUP_DONE: u32 = 1 << 1;
    /// SQRTS bits 7:4: the cleanup's error code (0 = the command was found
    /// and cleaned up).
    pub const fn cleanup_error(rts: u32) -> u8 {
        (rts >> 4 & 0xF) as u8
    }
    /// SQCTI value for the command with `task_tag` on `lun`.
    pub const fn cleanup_target(lun: u8, task_tag: u8) -> u32 {
        (lun as u32) << 8 | task_tag as u32
    }
}

/// Registers of the CQ doorbell block (offsets from CQDAO).
pub mod cq_op {
    /// CQ head, byte offset into the ring: the host writes it after reaping.
    pub const CQHP: usize = 0x00;
    /// CQ tail, byte offset into the ring, maintained by the controller.
    /// MCQ entries carry no phase bit: the CQ holds entries exactly when
    /// the host's head differs from this register.
    pub const CQTP: usize = 0x04;
}

/// Registers of the CQ interrupt block (offsets from CQISAO).
pub mod cq_int {
    /// CQ interrupt status: bit 0 TEPS (tail entry push), write 1 to clear.
    pub const CQIS: usize = 0x00;
    /// CQ interrupt enable.
    pub const CQIE: usize = 0x04;
    /// Tail entry push status.
    pub const TEPS: u32 = 1 << 0;
}

/// Size of one SQ or CQ entry; head and tail registers count bytes, so a
/// slot number is `register / ENTRY_SIZE`.
pub const ENTRY_SIZE: u32 = 32;

#[cfg(test)]
mod tests {
    use super::*;

    // Values a QEMU 10.0.2 UFS controller reports with mcq=on,mcq-maxq=4
    // (shared/guide/UFS.md, PROBE): a reading of those registers must give
    // the documented meaning.
    #[test]
    fn decodes_qemu_capabilities() {
        let cap = Cap(0x4107_021F);
        assert_eq!(cap.sdb_slots(), 32);
        assert_eq!(cap.tm_slots(), 8);
        assert!(cap.addr64());
        assert!(cap.mcq());
        let mcq = McqCap(0x0002_0203);
        assert_eq!(mcq.max_queues(), 4);
        assert!(mcq.round_robin());
        assert_eq!(mcq.config_offset(), 0x400);
        assert_eq!(
            QueueConfig::new(mcq, 1).reg(qcfg::CQDAO),
            0x400 + 0x40 + 0x2C
        );
        assert_eq!(Ver(0x400).major(), 4);
    }

    #[test]
    fn queue_attr_counts_dwords() {
        let a = QueueAttr::enabled(32, 3);
        assert_eq!(a.0, 0x8003_00FF);
        assert_eq!(a.entries(), 32);
        assert_eq!(a.cqid(), 3);
        assert!(a.is_enabled());
        assert_eq!(mcq_cfg_mac(32), 0x1F00);
    }
}
