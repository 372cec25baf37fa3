//! Host-memory structures of the transfer path (little-endian):
//! the UTP Transfer Request Descriptor (UTRD, the SQ entry in MCQ mode and
//! the list entry in legacy mode), the MCQ completion entry, the UTP
//! command descriptor (UCD) that a UTRD points at, and its PRDT entries.

use mcqio_vfio::PlainData;

/// Data direction of a transfer request (UTRD byte 3, bits 2:1).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DataDir {
    /// No data phase.
    None = 0,
    /// Host to device (a write).
    ToDevice = 1,
    /// Device to host (a read).
    FromDevice = 2,
}

/// Command type (UTRD byte 3, bits 7:4).
pub mod command_type {
    /// UFS storage command (UPIU based).
    pub const UFS_STORAGE: u8 = 0x1;
    /// A nullified entry: the controller consumes it without executing it
    /// (MCQ abort of an entry the controller has not fetched yet).
    pub const NULLIFIED: u8 = 0xF;
}

/// Overall Command Status (UTRD byte 8, CQE status bits 3:0): the
/// *transport* outcome. A SCSI error travels in the response UPIU with
/// OCS = [`Ocs::SUCCESS`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ocs(pub u8);

impl Ocs {
    /// The request was transported and a response UPIU received.
    pub const SUCCESS: Ocs = Ocs(0x0);
    /// The UTRD's command table attributes are invalid.
    pub const INVALID_CMD_TABLE_ATTR: Ocs = Ocs(0x1);
    /// The PRDT attributes are invalid.
    pub const INVALID_PRDT_ATTR: Ocs = Ocs(0x2);
    /// Data buffer size and transfer length disagree.
    pub const MISMATCH_DATA_BUF_SIZE: Ocs = Ocs(0x3);
    /// The response UPIU does not fit its buffer.
    pub const MISMATCH_RESP_UPIU_SIZE: Ocs = Ocs(0x4);
    /// Communication with the device failed.
    pub const PEER_COMM_FAILURE: Ocs = Ocs(0x5);
    /// The command was aborted (cleanup, task management).
    pub const ABORTED: Ocs = Ocs(0x6);
    /// Host controller fatal error.
    pub const FATAL_ERROR: Ocs = Ocs(0x7);
    /// Device fatal error.
    pub const DEVICE_FATAL_ERROR: Ocs = Ocs(0x8);
    /// Invalid crypto configuration.
    pub const INVALID_CRYPTO_CONFIG: Ocs = Ocs(0x9);
    /// General crypto error.
    pub const GENERAL_CRYPTO_ERROR: Ocs = Ocs(0xA);
    /// The value the host writes before submission; still there means the
    /// controller never completed the descriptor.
    pub const INVALID_COMMAND_STATUS: Ocs = Ocs(0xF);

    /// A short name for logs and errors.
    pub const fn name(self) -> &'static str {
        match self.0 {
            0x0 => "success",
            0x1 => "invalid command table attributes",
            0x2 => "invalid PRDT attributes",
            0x3 => "data buffer size mismatch",
            0x4 => "response UPIU size mismatch",
            0x5 => "peer communication failure",
            0x6 => "aborted",
            0x7 => "host controller fatal error",
            0x8 => "device fatal error",
            0x9 => "invalid crypto configuration",
            0xA => "general crypto error",
            0xF => "invalid command status (not completed)",
            _ => "reserved",
        }
    }
}

/// UTP Transfer Request Descriptor, 32 bytes.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Utrd {
    /// Crypto configuration index.
    pub cci: u8,
    /// Extra header segments length.
    pub ehs_len: u8,
    /// Bit 7: crypto enable.
    pub crypto: u8,
    /// Bit 0 interrupt on completion, bits 2:1 [`DataDir`], bits 7:4
    /// [`command_type`].
    pub flags: u8,
    /// Crypto data unit number, low 32 bits.
    pub dunl: u32,
    /// [`Ocs`]; the host pre-fills [`Ocs::INVALID_COMMAND_STATUS`].
    pub ocs: u8,
    /// Command duration scale.
    pub cds: u8,
    /// Logical data block count (crypto).
    pub ldbc: u16,
    /// Crypto data unit number, high 32 bits.
    pub dunu: u32,
    /// UTP command descriptor base address (128-byte aligned).
    pub ucd_base: u64,
    /// Response UPIU length, in dwords.
    pub resp_len_dw: u16,
    /// Response UPIU offset from the UCD base, in dwords.
    pub resp_off_dw: u16,
    /// PRDT length, in entries.
    pub prdt_entries: u16,
    /// PRDT offset from the UCD base, in dwords.
    pub prdt_off_dw: u16,
}

const _: () = assert!(std::mem::size_of::<Utrd>() == 32);
const _: () = assert!(std::mem::offset_of!(Utrd, ocs) == 8);
const _: () = assert!(std::mem::offset_of!(Utrd, ucd_base) == 16);
const _: () = assert!(std::mem::offset_of!(Utrd, prdt_off_dw) == 30);

// SAFETY: `#[repr(C)]`, integers only, 32 bytes without padding (asserted
// above): every bit pattern is valid.
unsafe impl PlainData for Utrd {}

impl Utrd {
    /// A UFS storage request for the command descriptor at `ucd` (laid out
    /// as [`Ucd`]) with `prdt_entries` PRDT entries, OCS pre-filled invalid.
    pub const fn new(ucd: u64, dir: DataDir, prdt_entries: u16) -> Utrd {
        Utrd {
            cci: 0,
            ehs_len: 0,
            crypto: 0,
            flags: command_type::UFS_STORAGE << 4 | (dir as u8) << 1,
            dunl: 0,
            ocs: Ocs::INVALID_COMMAND_STATUS.0,
            cds: 0,
            ldbc: 0,
            dunu: 0,
            ucd_base: ucd,
            resp_len_dw: (Ucd::RESPONSE_LEN / 4) as u16,
            resp_off_dw: (Ucd::RESPONSE_OFFSET / 4) as u16,
            prdt_entries,
            prdt_off_dw: (Ucd::PRDT_OFFSET / 4) as u16,
        }
    }

    /// The 32 bytes as four little-endian words, the layout on the wire:
    /// the hot path stores a UTRD with four 64-bit stores (`to_le` each)
    /// instead of one store per field.
    #[inline(always)]
    pub const fn to_le_words(&self) -> [u64; 4] {
        [
            self.cci as u64
                | (self.ehs_len as u64) << 8
                | (self.crypto as u64) << 16
                | (self.flags as u64) << 24
                | (self.dunl as u64) << 32,
            self.ocs as u64
                | (self.cds as u64) << 8
                | (self.ldbc as u64) << 16
                | (self.dunu as u64) << 32,
            self.ucd_base,
            self.resp_len_dw as u64
                | (self.resp_off_dw as u64) << 16
                | (self.prdt_entries as u64) << 32
                | (self.prdt_off_dw as u64) << 48,
        ]
    }

    /// The same request with the interrupt-on-completion bit (legacy mode
    /// needs it for the completion notification; polled MCQ queues don't).
    pub const fn with_interrupt(mut self) -> Utrd {
        self.flags |= 1;
        self
    }
    /// The command type (bits 7:4 of byte 3).
    pub const fn command_type(&self) -> u8 {
        self.flags >> 4
    }
    /// Turn this entry into a nullified one (MCQ abort before fetch).
    pub const fn nullified(mut self) -> Utrd {
        self.flags = (self.flags & 0x0F) | command_type::NULLIFIED << 4;
        self
    }
}

/// MCQ completion queue entry, 32 bytes.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct McqCqe {
    /// Bits 63:7 the command's UCD base address, bits 4:0 the SQ id.
    pub ucd_sqid: u64,
    /// Response UPIU length (dwords), copied from the UTRD.
    pub resp_len_dw: u16,
    /// Response UPIU offset (dwords).
    pub resp_off_dw: u16,
    /// PRDT length (entries).
    pub prdt_entries: u16,
    /// PRDT offset (dwords).
    pub prdt_off_dw: u16,
    /// Bits 3:0: [`Ocs`].
    pub status: u32,
    /// Reserved.
    pub reserved: [u32; 3],
}

const _: () = assert!(std::mem::size_of::<McqCqe>() == 32);
const _: () = assert!(std::mem::offset_of!(McqCqe, status) == 16);

// SAFETY: `#[repr(C)]`, integers only, 32 bytes without padding (asserted
// above): every bit pattern is valid.
unsafe impl PlainData for McqCqe {}

impl McqCqe {
    /// The UCD base address of the completed command: it identifies the
    /// command (the entry has no tag).
    pub const fn ucd(&self) -> u64 {
        self.ucd_sqid & !0x7F
    }
    /// The submission queue the command came from.
    pub const fn sq_id(&self) -> u8 {
        (self.ucd_sqid & 0x1F) as u8
    }
    /// The transport status.
    pub const fn ocs(&self) -> Ocs {
        Ocs((self.status & 0xF) as u8)
    }
}

/// PRDT entry, 16 bytes: one physically contiguous data segment.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PrdtEntry {
    /// Data address (dword aligned).
    pub addr: u64,
    /// Reserved.
    pub reserved: u32,
    /// Data byte count − 1; the low two bits must be 1 (dword granular).
    pub byte_count_m1: u32,
}

const _: () = assert!(std::mem::size_of::<PrdtEntry>() == 16);

// SAFETY: `#[repr(C)]`, integers only, 16 bytes without padding (asserted
// above): every bit pattern is valid.
unsafe impl PlainData for PrdtEntry {}

impl PrdtEntry {
    /// Most bytes one entry can describe.
    pub const MAX_BYTES: u32 = 256 * 1024;

    /// An entry for `len` bytes at `addr`, or `None` when `addr` is not
    /// dword aligned or `len` is zero, not a multiple of 4 or above
    /// [`Self::MAX_BYTES`].
    pub const fn new(addr: u64, len: u32) -> Option<PrdtEntry> {
        if addr & 3 != 0 || len == 0 || len & 3 != 0 || len > Self::MAX_BYTES {
            return None;
        }
        Some(PrdtEntry {
            addr,
            reserved: 0,
            byte_count_m1: len - 1,
        })
    }
    /// Bytes described.
    pub const fn len(&self) -> u32 {
        (self.byte_count_m1 & 0x3_FFFF) + 1
    }

    /// The 16 bytes as two little-endian words (see [`Utrd::to_le_words`]).
    #[inline(always)]
    pub const fn to_le_words(&self) -> [u64; 2] {
        [
            self.addr,
            self.reserved as u64 | (self.byte_count_m1 as u64) << 32,
        ]
    }
    /// Never true for a valid entry (an entry describes at least 4 bytes).
    pub const fn is_empty(&self) -> bool {
        false
    }
}

/// Layout of a UTP command descriptor (the engine's choice: the UTRD
/// carries the response and PRDT offsets and lengths, in dwords, and the
/// controller uses what it says). The base must be 128-byte aligned.
///
/// ```text
///   0  COMMAND UPIU (32 B)      } one 64-byte cache line: what the host
///  32  PRDT, up to 256 entries  } writes for a 4 KiB command
/// 4160 RESPONSE UPIU (512 B), the device writes it
/// ```
///
/// Linux and QEMU's tests put the command at 0, the response at 512 and
/// the PRDT at 1024, three cache lines the host writes (or clears) and the
/// device reads or writes for every command. On a polled path each such
/// line moves between the two cores (or the host and a controller) per
/// command, so the COMMAND UPIU and the first PRDT entries share one line
/// here. A command UPIU longer than 32 bytes (a data segment) is allowed
/// only without a PRDT; a PRDT of one entry leaves the rest of the PRDT
/// area free for a parameter list the command's PRDT names.
pub struct Ucd;

impl Ucd {
    /// Required alignment of a UCD base address.
    pub const ALIGN: u64 = 128;
    /// Offset of the command UPIU.
    pub const COMMAND_OFFSET: usize = 0;
    /// Room for the command UPIU when the command has a PRDT (header,
    /// fields, CDB: a COMMAND UPIU). Without a PRDT, a command UPIU may
    /// extend into the PRDT area.
    pub const COMMAND_LEN: usize = 32;
    /// Offset of the PRDT: right after the 32-byte command UPIU, in its
    /// cache line.
    pub const PRDT_OFFSET: usize = 32;
    /// Most PRDT entries a UCD has room for.
    pub const MAX_PRDT_ENTRIES: usize = 256;
    /// Offset of the response UPIU: after the largest PRDT, on a cache line.
    pub const RESPONSE_OFFSET: usize = (Self::PRDT_OFFSET + Self::MAX_PRDT_ENTRIES * 16 + 63) & !63;
    /// Room for the response UPIU (header, sense or query data).
    pub const RESPONSE_LEN: usize = 512;

    /// Bytes of a UCD with room for `prdt_entries` entries (at most
    /// [`Ucd::MAX_PRDT_ENTRIES`]) and the response, rounded up to the
    /// 128-byte alignment so UCDs can sit back to back. The response
    /// follows the largest PRDT, so this is the same for every count.
    pub const fn size(prdt_entries: usize) -> usize {
        let prdt_end = Self::PRDT_OFFSET + prdt_entries * 16;
        let rsp_end = Self::RESPONSE_OFFSET + Self::RESPONSE_LEN;
        let raw = if prdt_end > rsp_end {
            prdt_end
        } else {
            rsp_end
        };
        (raw + Self::ALIGN as usize - 1) & !(Self::ALIGN as usize - 1)
    }
}

const _: () = assert!(Ucd::PRDT_OFFSET >= Ucd::COMMAND_OFFSET + 32);
const _: () = assert!(
    Ucd::PRDT_OFFSET + 16 <= 64,
    "the first PRDT entry shares the command's line"
);
const _: () = assert!(Ucd::PRDT_OFFSET + Ucd::MAX_PRDT_ENTRIES * 16 <= Ucd::RESPONSE_OFFSET);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utrd_bytes_follow_the_spec_table() {
        let d = Utrd::new(0x1_2345_6780, DataDir::FromDevice, 2).with_interrupt();
        // SAFETY: `Utrd` is PlainData (repr(C), no padding), so viewing it
        // as 32 bytes is sound.
        let b: [u8; 32] = unsafe { std::mem::transmute(d) };
        assert_eq!(b[3], 0x15, "CT=1, DD=2 (device to host), I=1");
        assert_eq!(b[8], 0x0F, "OCS pre-filled invalid");
        assert_eq!(&b[16..24], &0x1_2345_6780u64.to_le_bytes());
        assert_eq!(
            u16::from_le_bytes([b[24], b[25]]),
            128,
            "response length, dwords"
        );
        assert_eq!(
            u16::from_le_bytes([b[26], b[27]]),
            4160 / 4,
            "response offset, dwords"
        );
        assert_eq!(u16::from_le_bytes([b[28], b[29]]), 2, "PRDT entries");
        assert_eq!(
            u16::from_le_bytes([b[30], b[31]]),
            32 / 4,
            "PRDT offset, dwords"
        );
        assert_eq!(d.nullified().command_type(), command_type::NULLIFIED);
        let w = d.to_le_words();
        let mut from_words = [0u8; 32];
        for (i, w) in w.iter().enumerate() {
            from_words[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(from_words, b, "the word form is the same 32 bytes");
    }

    #[test]
    fn cqe_names_its_command_by_ucd_address() {
        let c = McqCqe {
            ucd_sqid: 0xABCD_E080 | 3,
            status: 0x6,
            ..Default::default()
        };
        assert_eq!(c.ucd(), 0xABCD_E080);
        assert_eq!(c.sq_id(), 3);
        assert_eq!(c.ocs(), Ocs::ABORTED);
    }

    #[test]
    fn prdt_entries_are_dword_granular_and_bounded() {
        let e = PrdtEntry::new(0x1000, 4096).unwrap();
        assert_eq!(e.byte_count_m1, 4095);
        assert_eq!(e.len(), 4096);
        assert!(PrdtEntry::new(0x1002, 4096).is_none());
        assert!(PrdtEntry::new(0x1000, 0).is_none());
        assert!(PrdtEntry::new(0x1000, 6).is_none());
        assert!(PrdtEntry::new(0x1000, PrdtEntry::MAX_BYTES + 4).is_none());
        assert_eq!(Ucd::RESPONSE_OFFSET, 4160);
        assert_eq!(Ucd::size(0), 4736, "4160 + 512, rounded to 128");
        assert_eq!(Ucd::size(1), Ucd::size(Ucd::MAX_PRDT_ENTRIES));
        assert_eq!(Ucd::size(8) % 128, 0);
        let e = PrdtEntry::new(0x1_2345_6780, 8192).unwrap();
        let w = e.to_le_words();
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&w[0].to_le_bytes());
        b[8..].copy_from_slice(&w[1].to_le_bytes());
        assert_eq!(&b[..8], &0x1_2345_6780u64.to_le_bytes(), "data address");
        assert_eq!(&b[12..], &8191u32.to_le_bytes(), "byte count - 1");
    }
}
