//! Identify Controller and Identify Namespace data, parsed into owned structs.
//!
//! Parsing takes the 4096-byte page as bytes (copied out of DMA memory) and
//! validates what the driver relies on, so a malformed page is a typed
//! [`IdentifyError`], never a panic or a wrong block size.

use std::fmt;

/// Size of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// Why an identify page could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    /// The page is not 4096 bytes.
    #[error("identify data is {0} bytes, expected 4096")]
    Length(usize),
    /// FLBAS selects an LBA format beyond NLBAF.
    #[error("namespace selects LBA format {index} but reports only {count} formats")]
    BadFormatIndex {
        /// Selected format index.
        index: u8,
        /// Formats reported.
        count: u8,
    },
    /// An LBA data size outside 512 B .. 2 GiB.
    #[error("namespace LBA data size 2^{0} is outside the valid range 2^9..2^31")]
    BadLbaSize(u8),
    /// The controller reports queue entry sizes mcqio cannot use.
    #[error("controller requires SQ entries of 2^{sq_min} and CQ entries of 2^{cq_min} bytes; mcqio uses 64 and 16")]
    EntrySizes {
        /// Minimum SQ entry size (log2).
        sq_min: u8,
        /// Minimum CQ entry size (log2).
        cq_min: u8,
    },
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn le64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}
fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .trim_start()
        .to_string()
}

/// Optional Admin Command Support (OACS) bits.
pub mod oacs {
    /// Security Send/Receive.
    pub const SECURITY: u16 = 1 << 0;
    /// Format NVM.
    pub const FORMAT: u16 = 1 << 1;
    /// Firmware Commit/Download.
    pub const FIRMWARE: u16 = 1 << 2;
    /// Namespace Management.
    pub const NS_MANAGEMENT: u16 = 1 << 3;
    /// Doorbell Buffer Config (shadow doorbells).
    pub const DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;
}

/// Optional NVM Command Support (ONCS) bits.
pub mod oncs {
    /// Compare.
    pub const COMPARE: u16 = 1 << 0;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
    /// Verify.
    pub const VERIFY: u16 = 1 << 7;
}

/// The Identify Controller fields mcqio uses.
#[derive(Clone, PartialEq, Eq)]
pub struct IdentifyController {
    /// PCI Vendor ID.
    pub vid: u16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: u16,
    /// Serial number (trimmed).
    pub serial: String,
    /// Model number (trimmed).
    pub model: String,
    /// Firmware revision (trimmed).
    pub firmware: String,
    /// Maximum Data Transfer Size as log2 of memory pages (0: no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version the controller reports in identify (0 if not reported).
    pub ver: u32,
    /// Optional Admin Command Support ([`oacs`]).
    pub oacs: u16,
    /// Abort Command Limit (0's based).
    pub acl: u8,
    /// Asynchronous Event Request Limit (0's based).
    pub aerl: u8,
    /// SQ entry sizes: required (bits 3:0) and maximum (7:4), log2 bytes.
    pub sqes: u8,
    /// CQ entry sizes: required (bits 3:0) and maximum (7:4), log2 bytes.
    pub cqes: u8,
    /// Maximum outstanding commands (0: not reported).
    pub maxcmd: u16,
    /// Number of namespaces (the highest valid NSID).
    pub nn: u32,
    /// Optional NVM Command Support ([`oncs`]).
    pub oncs: u16,
    /// Volatile Write Cache present (bit 0).
    pub vwc: u8,
    /// SGL Support.
    pub sgls: u32,
}

impl IdentifyController {
    /// Parse a 4096-byte Identify Controller page.
    pub fn parse(b: &[u8]) -> Result<Self, IdentifyError> {
        if b.len() != IDENTIFY_LEN {
            return Err(IdentifyError::Length(b.len()));
        }
        let c = IdentifyController {
            vid: le16(b, 0),
            ssvid: le16(b, 2),
            serial: ascii(&b[4..24]),
            model: ascii(&b[24..64]),
            firmware: ascii(&b[64..72]),
            mdts: b[77],
            cntlid: le16(b, 78),
            ver: le32(b, 80),
            oacs: le16(b, 256),
            acl: b[258],
            aerl: b[259],
            sqes: b[512],
            cqes: b[513],
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            oncs: le16(b, 520),
            vwc: b[525],
            sgls: le32(b, 536),
        };
        // We always use 64-byte SQEs and 16-byte CQEs. A controller whose
        // *required* size is larger cannot be driven. (A zero field is
        // accepted: some emulations leave it unset.)
        let (sq_min, cq_min) = (c.sqes & 0xF, c.cqes & 0xF);
        if sq_min > 6 || cq_min > 4 {
            return Err(IdentifyError::EntrySizes { sq_min, cq_min });
        }
        Ok(c)
    }

    /// Maximum data transfer in bytes for a memory page size of
    /// `1 << page_shift` bytes, or `None` when unlimited.
    pub fn max_transfer_bytes(&self, page_shift: u32) -> Option<u64> {
        if self.mdts == 0 {
            None
        } else {
            1u64.checked_shl(self.mdts as u32 + page_shift)
        }
    }
    /// Whether shadow doorbells (Doorbell Buffer Config) are supported.
    pub fn supports_doorbell_buffer(&self) -> bool {
        self.oacs & oacs::DOORBELL_BUFFER_CONFIG != 0
    }
    /// Whether Dataset Management (deallocate) is supported.
    pub fn supports_dsm(&self) -> bool {
        self.oncs & oncs::DATASET_MANAGEMENT != 0
    }
    /// Whether Write Zeroes is supported.
    pub fn supports_write_zeroes(&self) -> bool {
        self.oncs & oncs::WRITE_ZEROES != 0
    }
    /// Whether a volatile write cache is present.
    pub fn has_volatile_write_cache(&self) -> bool {
        self.vwc & 1 != 0
    }
    /// Whether SGLs are supported for NVM commands.
    pub fn supports_sgl(&self) -> bool {
        self.sgls & 0b11 != 0
    }
}

impl fmt::Debug for IdentifyController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentifyController")
            .field("vid", &format_args!("{:#06x}", self.vid))
            .field("serial", &self.serial)
            .field("model", &self.model)
            .field("firmware", &self.firmware)
            .field("mdts", &self.mdts)
            .field("nn", &self.nn)
            .field("oacs", &format_args!("{:#x}", self.oacs))
            .field("oncs", &format_args!("{:#x}", self.oncs))
            .field("vwc", &self.vwc)
            .field("sgls", &format_args!("{:#x}", self.sgls))
            .finish_non_exhaustive()
    }
}

/// One LBA format descriptor.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LbaFormat {
    /// Metadata bytes per block.
    pub ms: u16,
    /// LBA data size as log2 bytes.
    pub lbads: u8,
    /// Relative performance (0 best .. 3 degraded).
    pub rp: u8,
}

impl LbaFormat {
    /// Block size in bytes; 0 for a format whose LBADS is 64 or more (the
    /// device reported garbage: not a usable format). The format in use is
    /// checked by [`IdentifyNamespace::parse`] (LBADS 9..=31).
    pub fn lba_size(&self) -> u64 {
        1u64.checked_shl(self.lbads as u32).unwrap_or(0)
    }
}

/// The Identify Namespace fields mcqio uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// Namespace size in logical blocks.
    pub nsze: u64,
    /// Namespace capacity in logical blocks.
    pub ncap: u64,
    /// Namespace utilization in logical blocks.
    pub nuse: u64,
    /// Namespace features.
    pub nsfeat: u8,
    /// Formatted LBA size: the raw byte.
    pub flbas: u8,
    /// Supported LBA formats (NLBAF + 1 entries).
    pub lba_formats: Vec<LbaFormat>,
}

impl IdentifyNamespace {
    /// Parse a 4096-byte Identify Namespace page.
    pub fn parse(b: &[u8]) -> Result<Self, IdentifyError> {
        if b.len() != IDENTIFY_LEN {
            return Err(IdentifyError::Length(b.len()));
        }
        let nlbaf = b[25] as usize + 1;
        let nlbaf = nlbaf.min(64);
        let lba_formats: Vec<LbaFormat> = (0..nlbaf)
            .map(|i| {
                let d = le32(b, 128 + 4 * i);
                LbaFormat {
                    ms: d as u16,
                    lbads: (d >> 16) as u8,
                    rp: ((d >> 24) & 0b11) as u8,
                }
            })
            .collect();
        let ns = IdentifyNamespace {
            nsze: le64(b, 0),
            ncap: le64(b, 8),
            nuse: le64(b, 16),
            nsfeat: b[24],
            flbas: b[26],
            lba_formats,
        };
        let idx = ns.format_index();
        let Some(fmt) = ns.lba_formats.get(idx as usize) else {
            return Err(IdentifyError::BadFormatIndex {
                index: idx,
                count: nlbaf as u8,
            });
        };
        if !(9..=31).contains(&fmt.lbads) {
            return Err(IdentifyError::BadLbaSize(fmt.lbads));
        }
        Ok(ns)
    }

    /// Index of the LBA format in use (FLBAS bits 3:0, plus 6:5 as the
    /// high bits when more than 16 formats exist).
    pub fn format_index(&self) -> u8 {
        let lo = self.flbas & 0xF;
        let hi = (self.flbas >> 5) & 0b11;
        if self.lba_formats.len() > 16 {
            lo | hi << 4
        } else {
            lo
        }
    }
    /// The LBA format in use. Valid after a successful [`Self::parse`].
    pub fn lba_format(&self) -> LbaFormat {
        self.lba_formats[self.format_index() as usize]
    }
    /// Block size in bytes.
    pub fn lba_size(&self) -> u64 {
        self.lba_format().lba_size()
    }
    /// log2 of the block size.
    pub fn lba_shift(&self) -> u32 {
        self.lba_format().lbads as u32
    }
    /// Metadata bytes per block in the format in use.
    pub fn metadata_size(&self) -> u16 {
        self.lba_format().ms
    }
}
