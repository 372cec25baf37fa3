//! Descriptors read with QUERY REQUEST (read descriptor): device, geometry
//! and unit. Multi-byte fields are big-endian. A parser takes the bytes the
//! device returned and refuses a descriptor too short for the fields it
//! needs, or whose header names another descriptor.

use super::{be16, be32, be64};

/// Descriptor identifiers (IDN).
pub mod idn {
    /// Device descriptor.
    pub const DEVICE: u8 = 0x00;
    /// Configuration descriptor.
    pub const CONFIGURATION: u8 = 0x01;
    /// Unit descriptor (index = LUN).
    pub const UNIT: u8 = 0x02;
    /// Interconnect descriptor.
    pub const INTERCONNECT: u8 = 0x04;
    /// String descriptor.
    pub const STRING: u8 = 0x05;
    /// Geometry descriptor.
    pub const GEOMETRY: u8 = 0x07;
    /// Power descriptor.
    pub const POWER: u8 = 0x08;
    /// Health descriptor.
    pub const HEALTH: u8 = 0x09;
}

/// Most bytes a descriptor read asks for.
pub const MAX_DESC_LEN: u16 = 255;

/// Why a descriptor could not be used.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescError {
    /// Fewer bytes than the fields we need.
    #[error("descriptor {idn:#04x} is {len} bytes, needs at least {need}")]
    TooShort {
        /// Descriptor IDN.
        idn: u8,
        /// Bytes received (bounded by bLength).
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The header names another descriptor.
    #[error("asked for descriptor {want:#04x}, got {got:#04x}")]
    WrongType {
        /// IDN asked for.
        want: u8,
        /// IDN in the header.
        got: u8,
    },
    /// A field holds a value the spec does not allow.
    #[error("descriptor {idn:#04x}: {what}")]
    Invalid {
        /// Descriptor IDN.
        idn: u8,
        /// What is wrong.
        what: &'static str,
    },
}

/// The usable bytes of a descriptor: bounded by what arrived and by its
/// own bLength, after checking the IDN and the minimum length.
fn body(d: &[u8], want: u8, need: usize) -> Result<&[u8], DescError> {
    if d.len() < 2 {
        return Err(DescError::TooShort {
            idn: want,
            len: d.len(),
            need,
        });
    }
    if d[1] != want {
        return Err(DescError::WrongType { want, got: d[1] });
    }
    let len = (d[0] as usize).min(d.len());
    if len < need {
        return Err(DescError::TooShort {
            idn: want,
            len,
            need,
        });
    }
    Ok(&d[..len])
}

/// The device descriptor fields the engine uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeviceDesc {
    /// Number of enabled logical units (bNumberLU).
    pub lus: u8,
    /// Number of well-known logical units (bNumberWLU).
    pub wlus: u8,
    /// UFS version, BCD (wSpecVersion, e.g. 0x0400).
    pub spec_version: u16,
    /// Manufacturer id (wManufacturerID).
    pub manufacturer: u16,
    /// Shared queue depth (bQueueDepth); 0 when the device has a queue
    /// per LU instead.
    pub queue_depth: u8,
}

impl DeviceDesc {
    /// Offsets in the descriptor.
    const NUMBER_LU: usize = 0x06;
    const NUMBER_WLU: usize = 0x07;
    const SPEC_VERSION: usize = 0x10;
    const MANUFACTURER_ID: usize = 0x18;
    const QUEUE_DEPTH: usize = 0x21;

    /// Decode a device descriptor.
    pub fn parse(d: &[u8]) -> Result<DeviceDesc, DescError> {
        let b = body(d, idn::DEVICE, Self::QUEUE_DEPTH + 1)?;
        Ok(DeviceDesc {
            lus: b[Self::NUMBER_LU],
            wlus: b[Self::NUMBER_WLU],
            spec_version: be16(b, Self::SPEC_VERSION),
            manufacturer: be16(b, Self::MANUFACTURER_ID),
            queue_depth: b[Self::QUEUE_DEPTH],
        })
    }
}

/// The geometry descriptor fields the engine uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GeometryDesc {
    /// Raw capacity in 512-byte units (qTotalRawDeviceCapacity).
    pub raw_capacity_512: u64,
    /// Most logical units the device supports (bMaxNumberLU: 0 → 8, 1 → 32).
    pub max_lus: u8,
    /// Segment size in 512-byte units (dSegmentSize).
    pub segment_size_512: u32,
    /// Smallest addressable block in 512-byte units (bMinAddrBlockSize).
    pub min_block_512: u8,
}

impl GeometryDesc {
    const RAW_CAPACITY: usize = 0x04;
    const MAX_NUMBER_LU: usize = 0x0C;
    const SEGMENT_SIZE: usize = 0x0D;
    const MIN_ADDR_BLOCK: usize = 0x12;

    /// Decode a geometry descriptor.
    pub fn parse(d: &[u8]) -> Result<GeometryDesc, DescError> {
        let b = body(d, idn::GEOMETRY, Self::MIN_ADDR_BLOCK + 1)?;
        let max_lus = match b[Self::MAX_NUMBER_LU] {
            0 => 8,
            1 => 32,
            _ => {
                return Err(DescError::Invalid {
                    idn: idn::GEOMETRY,
                    what: "bMaxNumberLU is neither 0 (8 LUs) nor 1 (32 LUs)",
                })
            }
        };
        Ok(GeometryDesc {
            raw_capacity_512: be64(b, Self::RAW_CAPACITY),
            max_lus,
            segment_size_512: be32(b, Self::SEGMENT_SIZE),
            min_block_512: b[Self::MIN_ADDR_BLOCK],
        })
    }
}

/// The unit descriptor fields the engine uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UnitDesc {
    /// The LU this describes (bUnitIndex).
    pub lun: u8,
    /// Whether the LU is enabled (bLUEnable = 1, or 2 for an HPB LU).
    pub enabled: bool,
    /// Per-LU queue depth (bLUQueueDepth; 0 with a shared queue).
    pub queue_depth: u8,
    /// Logical block size as log2 of bytes (bLogicalBlockSize, ≥ 12).
    pub block_shift: u8,
    /// Number of logical blocks (qLogicalBlockCount).
    pub blocks: u64,
    /// Provisioning type (bProvisioningType: 2/3 = thin, UNMAP supported).
    pub provisioning: u8,
}

impl UnitDesc {
    const UNIT_INDEX: usize = 0x02;
    const LU_ENABLE: usize = 0x03;
    const LU_QUEUE_DEPTH: usize = 0x06;
    const BLOCK_SIZE: usize = 0x0A;
    const BLOCK_COUNT: usize = 0x0B;
    const PROVISIONING: usize = 0x17;

    /// Decode a unit descriptor. A block size outside 512 B..=1 MiB or a
    /// capacity whose byte count overflows is an error, not a panic later.
    pub fn parse(d: &[u8]) -> Result<UnitDesc, DescError> {
        let b = body(d, idn::UNIT, Self::PROVISIONING + 1)?;
        let block_shift = b[Self::BLOCK_SIZE];
        if !(9..=20).contains(&block_shift) {
            return Err(DescError::Invalid {
                idn: idn::UNIT,
                what: "bLogicalBlockSize outside 2^9..2^20 bytes",
            });
        }
        let blocks = be64(b, Self::BLOCK_COUNT);
        if blocks
            .checked_shl(block_shift as u32)
            .map(|v| v >> block_shift)
            != Some(blocks)
        {
            return Err(DescError::Invalid {
                idn: idn::UNIT,
                what: "qLogicalBlockCount × block size overflows 64 bits",
            });
        }
        Ok(UnitDesc {
            lun: b[Self::UNIT_INDEX],
            enabled: matches!(b[Self::LU_ENABLE], 1 | 2),
            queue_depth: b[Self::LU_QUEUE_DEPTH],
            block_shift,
            blocks,
            provisioning: b[Self::PROVISIONING],
        })
    }
    /// Capacity in bytes (checked not to overflow in [`Self::parse`]).
    pub const fn size_bytes(&self) -> u64 {
        self.blocks << self.block_shift
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> Vec<u8> {
        let mut d = vec![0u8; 0x59];
        d[0] = 0x59;
        d[1] = idn::DEVICE;
        d[6] = 1;
        d[7] = 4;
        d[0x10..0x12].copy_from_slice(&0x0400u16.to_be_bytes());
        d[0x21] = 32;
        d
    }

    #[test]
    fn device_descriptor() {
        let dd = DeviceDesc::parse(&device()).unwrap();
        assert_eq!(
            (dd.lus, dd.wlus, dd.spec_version, dd.queue_depth),
            (1, 4, 0x400, 32)
        );
        let mut short = device();
        short[0] = 0x10; // bLength says 16 bytes
        assert!(matches!(
            DeviceDesc::parse(&short),
            Err(DescError::TooShort { .. })
        ));
        let mut wrong = device();
        wrong[1] = idn::UNIT;
        assert!(matches!(
            DeviceDesc::parse(&wrong),
            Err(DescError::WrongType { .. })
        ));
        assert!(DeviceDesc::parse(&[]).is_err());
    }

    #[test]
    fn unit_descriptor_bounds_device_values() {
        let mut u = vec![0u8; 0x2D];
        u[0] = 0x2D;
        u[1] = idn::UNIT;
        u[2] = 1;
        u[3] = 1;
        u[0x0A] = 12;
        u[0x0B..0x13].copy_from_slice(&1024u64.to_be_bytes());
        let ud = UnitDesc::parse(&u).unwrap();
        assert_eq!((ud.lun, ud.enabled, ud.size_bytes()), (1, true, 4 << 20));
        u[0x0A] = 64;
        assert!(UnitDesc::parse(&u).is_err(), "block size 2^64");
        u[0x0A] = 12;
        u[0x0B..0x13].copy_from_slice(&(u64::MAX / 2).to_be_bytes());
        assert!(UnitDesc::parse(&u).is_err(), "capacity overflows");
    }

    #[test]
    fn geometry_descriptor() {
        let mut g = vec![0u8; 0x57];
        g[0] = 0x57;
        g[1] = idn::GEOMETRY;
        g[4..12].copy_from_slice(&(1u64 << 21).to_be_bytes());
        g[0x0C] = 1;
        let gd = GeometryDesc::parse(&g).unwrap();
        assert_eq!((gd.raw_capacity_512, gd.max_lus), (1 << 21, 32));
        g[0x0C] = 7;
        assert!(GeometryDesc::parse(&g).is_err());
    }
}
