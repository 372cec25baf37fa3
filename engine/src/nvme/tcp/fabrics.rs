//! The Fabrics command set (opcode 0x7F) and the pieces of NVMe that a
//! fabric transport adds: Connect, Property Get/Set in place of register
//! MMIO, Disconnect, Keep Alive, the SGL descriptors NVMe/TCP puts in
//! SGL1, and the Fabrics fields of Identify Controller.
//!
//! A Fabrics command is an SQE whose byte 0 is 0x7F and byte 4 (where an
//! NVMe command keeps its NSID) is the Fabrics command type; its SGL1
//! (bytes 24–39) describes the data and its command-specific bytes start
//! at 40 (CDW10).

use mcqio_vfio::PlainData;

use crate::nvme::spec::{regs, Cqe, Sqe};

/// The Fabrics command opcode.
pub const FABRICS_OPCODE: u8 = 0x7F;

/// The Keep Alive admin opcode (also used on PCIe with KATO set).
pub const KEEP_ALIVE_OPCODE: u8 = 0x18;

/// Fabrics command types (SQE byte 4).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTH_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTH_RECV: u8 = 0x06;
    /// Disconnect (an I/O queue).
    pub const DISCONNECT: u8 = 0x08;
}

/// Property offsets: the controller registers a fabric reads and writes
/// with Property Get/Set (the same offsets as the PCIe BAR).
pub mod property {
    use super::regs;
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = regs::CAP as u32;
    /// Version (4 bytes).
    pub const VS: u32 = regs::VS as u32;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = regs::CC as u32;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = regs::CSTS as u32;
    /// NVM Subsystem Reset (4 bytes).
    pub const NSSR: u32 = regs::NSSR as u32;
}

/// Size of a property access (ATTRIB bits 2:0).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PropertySize {
    /// 4 bytes (ATTRIB 0).
    Four,
    /// 8 bytes (ATTRIB 1).
    Eight,
}

impl PropertySize {
    /// The size a property at `offset` has (CAP is 8 bytes, the rest 4).
    pub const fn of(offset: u32) -> Self {
        if offset == property::CAP {
            PropertySize::Eight
        } else {
            PropertySize::Four
        }
    }
    const fn attrib(self) -> u32 {
        match self {
            PropertySize::Four => 0,
            PropertySize::Eight => 1,
        }
    }
}

/// The CNTLID an admin-queue Connect asks with: "any controller"
/// (the dynamic controller model assigns one).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// Bytes of the Connect command's data.
pub const CONNECT_DATA_BYTES: usize = 1024;

/// Bytes an NQN field holds (NUL-terminated within).
pub const NQN_BYTES: usize = 256;

/// The SGL descriptor type/subtype byte (byte 15) values NVMe/TCP uses.
pub mod sgl {
    /// Data Block descriptor type.
    pub const TYPE_DATA_BLOCK: u8 = 0x0;
    /// Transport SGL Data Block descriptor type.
    pub const TYPE_TRANSPORT_DATA_BLOCK: u8 = 0x5;
    /// Subtype: Address (a host address).
    pub const SUBTYPE_ADDRESS: u8 = 0x0;
    /// Subtype: Offset (into the in-capsule data).
    pub const SUBTYPE_OFFSET: u8 = 0x1;
    /// Subtype: transport specific.
    pub const SUBTYPE_TRANSPORT: u8 = 0xA;
}

/// PSDT (CDW0 bits 15:14) = 01b: the data pointer is an SGL.
const PSDT_SGL: u32 = 0b01 << 14;

/// A 16-byte SGL descriptor.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SglDescriptor {
    /// Address or offset.
    pub address: u64,
    /// Length in bytes.
    pub length: u32,
    /// Reserved.
    pub rsvd: [u8; 3],
    /// Type (bits 7:4) and subtype (bits 3:0).
    pub type_subtype: u8,
}

const _: () = assert!(std::mem::size_of::<SglDescriptor>() == 16);
// SAFETY: `#[repr(C)]`, integers and bytes only, 16 bytes without padding
// (asserted above): every bit pattern is valid.
unsafe impl PlainData for SglDescriptor {}

impl SglDescriptor {
    /// A Transport SGL Data Block of `length` bytes: the data moves by
    /// R2T/H2CData (writes) or C2HData (reads).
    pub const fn transport(length: u32) -> Self {
        SglDescriptor {
            address: 0,
            length,
            rsvd: [0; 3],
            type_subtype: sgl::TYPE_TRANSPORT_DATA_BLOCK << 4 | sgl::SUBTYPE_TRANSPORT,
        }
    }
    /// A Data Block with an offset into the in-capsule data.
    pub const fn in_capsule(offset: u64, length: u32) -> Self {
        SglDescriptor {
            address: offset,
            length,
            rsvd: [0; 3],
            type_subtype: sgl::TYPE_DATA_BLOCK << 4 | sgl::SUBTYPE_OFFSET,
        }
    }
    /// The descriptor type.
    pub const fn sgl_type(&self) -> u8 {
        self.type_subtype >> 4
    }
    /// The descriptor subtype.
    pub const fn subtype(&self) -> u8 {
        self.type_subtype & 0xF
    }
    /// Whether this is the in-capsule form.
    pub const fn is_in_capsule(&self) -> bool {
        self.sgl_type() == sgl::TYPE_DATA_BLOCK && self.subtype() == sgl::SUBTYPE_OFFSET
    }
    /// Whether this is the transport form.
    pub const fn is_transport(&self) -> bool {
        self.sgl_type() == sgl::TYPE_TRANSPORT_DATA_BLOCK
            && self.subtype() == sgl::SUBTYPE_TRANSPORT
    }
    /// The descriptor in SQE SGL1 (the `prp1`/`prp2` words).
    pub const fn from_sqe(sqe: &Sqe) -> Self {
        SglDescriptor {
            address: sqe.prp1,
            length: sqe.prp2 as u32,
            rsvd: [
                (sqe.prp2 >> 32) as u8,
                (sqe.prp2 >> 40) as u8,
                (sqe.prp2 >> 48) as u8,
            ],
            type_subtype: (sqe.prp2 >> 56) as u8,
        }
    }
}

/// Extension of [`Sqe`] for fabrics: SGL1 and the Fabrics command type.
pub trait FabricsSqe {
    /// Put `sgl` in SGL1 and set PSDT to SGL.
    fn with_sgl(self, sgl: SglDescriptor) -> Self;
    /// The Fabrics command type (byte 4) of a 0x7F command.
    fn fctype(&self) -> u8;
}

impl FabricsSqe for Sqe {
    fn with_sgl(mut self, sgl: SglDescriptor) -> Self {
        self.cdw0 = (self.cdw0 & !(0b11 << 14)) | PSDT_SGL;
        self.prp1 = sgl.address;
        self.prp2 = sgl.length as u64
            | (sgl.rsvd[0] as u64) << 32
            | (sgl.rsvd[1] as u64) << 40
            | (sgl.rsvd[2] as u64) << 48
            | (sgl.type_subtype as u64) << 56;
        self
    }
    fn fctype(&self) -> u8 {
        self.nsid as u8
    }
}

fn fabrics(fctype: u8) -> Sqe {
    let mut s = Sqe::with_opcode(FABRICS_OPCODE);
    s.nsid = fctype as u32;
    s
}

/// Connect: bind this connection to queue `qid` of a controller.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    /// Queue id (0: admin).
    pub qid: u16,
    /// Submission queue size, entries (encoded 0's based).
    pub sqsize: u16,
    /// Keep Alive Timeout in milliseconds (admin queue; 0 disables).
    pub kato_ms: u32,
}

impl Connect {
    /// The SQE (SGL1 still to be set: the 1024 data bytes go in-capsule).
    pub fn sqe(&self) -> Sqe {
        let mut s = fabrics(fctype::CONNECT);
        // CDW10: RECFMT 0 (bits 15:0), QID (31:16).
        s.cdw10 = (self.qid as u32) << 16;
        // CDW11: SQSIZE (15:0, 0's based), CATTR (23:16).
        s.cdw11 = self.sqsize.saturating_sub(1) as u32;
        s.cdw12 = self.kato_ms;
        s
    }
    /// Decode a Connect SQE (a controller's side).
    pub fn from_sqe(sqe: &Sqe) -> Self {
        Connect {
            qid: (sqe.cdw10 >> 16) as u16,
            sqsize: (sqe.cdw11 as u16).wrapping_add(1),
            kato_ms: sqe.cdw12,
        }
    }
    /// The CNTLID a successful Connect response assigns (DW0 15:0).
    pub const fn cntlid(cqe: &Cqe) -> u16 {
        cqe.dw0 as u16
    }
}

/// The 1024-byte Connect data.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Controller id: [`CNTLID_DYNAMIC`] on the admin queue, the assigned
    /// one on I/O queues.
    pub cntlid: u16,
    /// Reserved.
    pub rsvd0: [u8; 238],
    /// Subsystem NQN, NUL-terminated.
    pub subnqn: [u8; NQN_BYTES],
    /// Host NQN, NUL-terminated.
    pub hostnqn: [u8; NQN_BYTES],
    /// Reserved.
    pub rsvd1: [u8; 256],
}

const _: () = assert!(std::mem::size_of::<ConnectData>() == CONNECT_DATA_BYTES);
const _: () = assert!(std::mem::offset_of!(ConnectData, cntlid) == 16);
const _: () = assert!(std::mem::offset_of!(ConnectData, subnqn) == 256);
const _: () = assert!(std::mem::offset_of!(ConnectData, hostnqn) == 512);
// SAFETY: `#[repr(C)]` of byte arrays and one `u16` at an even offset,
// 1024 bytes without padding (asserted above): every bit pattern is valid.
unsafe impl PlainData for ConnectData {}

/// An NQN longer than 255 bytes (no room for the NUL).
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("NQN of {0} bytes exceeds 255")]
pub struct NqnTooLong(pub usize);

fn nqn_field(nqn: &str) -> Result<[u8; NQN_BYTES], NqnTooLong> {
    let b = nqn.as_bytes();
    if b.len() >= NQN_BYTES {
        return Err(NqnTooLong(b.len()));
    }
    let mut f = [0u8; NQN_BYTES];
    f[..b.len()].copy_from_slice(b);
    Ok(f)
}

/// The bytes of an NQN field up to its first NUL.
pub fn nqn_str(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    &field[..end]
}

impl ConnectData {
    /// Connect data for `hostid`, `cntlid`, `subnqn`, `hostnqn`.
    pub fn new(
        hostid: [u8; 16],
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
    ) -> Result<Self, NqnTooLong> {
        Ok(ConnectData {
            hostid,
            cntlid,
            rsvd0: [0; 238],
            subnqn: nqn_field(subnqn)?,
            hostnqn: nqn_field(hostnqn)?,
            rsvd1: [0; 256],
        })
    }
    /// The 1024 wire bytes.
    pub fn to_bytes(&self) -> [u8; CONNECT_DATA_BYTES] {
        let mut out = [0u8; CONNECT_DATA_BYTES];
        out[..16].copy_from_slice(&self.hostid);
        out[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        out[256..512].copy_from_slice(&self.subnqn);
        out[512..768].copy_from_slice(&self.hostnqn);
        out
    }
    /// Decode 1024 wire bytes (`None` if fewer).
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < CONNECT_DATA_BYTES {
            return None;
        }
        let mut d = ConnectData::new([0; 16], 0, "", "").ok()?;
        d.hostid.copy_from_slice(&b[..16]);
        d.cntlid = u16::from_le_bytes([b[16], b[17]]);
        d.subnqn.copy_from_slice(&b[256..512]);
        d.hostnqn.copy_from_slice(&b[512..768]);
        Some(d)
    }
}

/// Property Get of the property at `offset`.
pub fn property_get(offset: u32, size: PropertySize) -> Sqe {
    let mut s = fabrics(fctype::PROPERTY_GET);
    s.cdw10 = size.attrib();
    s.cdw11 = offset;
    s
}

/// Property Set of the property at `offset` to `value`.
pub fn property_set(offset: u32, size: PropertySize, value: u64) -> Sqe {
    let mut s = fabrics(fctype::PROPERTY_SET);
    s.cdw10 = size.attrib();
    s.cdw11 = offset;
    s.cdw12 = value as u32;
    s.cdw13 = (value >> 32) as u32;
    s
}

/// Decode a Property Get/Set SQE: offset, size, value (Set).
pub fn property_fields(sqe: &Sqe) -> (u32, PropertySize, u64) {
    let size = if sqe.cdw10 & 0b111 == 1 {
        PropertySize::Eight
    } else {
        PropertySize::Four
    };
    (sqe.cdw11, size, sqe.cdw12 as u64 | (sqe.cdw13 as u64) << 32)
}

/// The value a Property Get returned (DW0 and, for 8 bytes, DW1).
pub const fn property_value(cqe: &Cqe, size: PropertySize) -> u64 {
    match size {
        PropertySize::Four => cqe.dw0 as u64,
        PropertySize::Eight => cqe.dw0 as u64 | (cqe.dw1 as u64) << 32,
    }
}

/// Disconnect (the queue this connection carries).
pub fn disconnect() -> Sqe {
    fabrics(fctype::DISCONNECT)
}

/// Keep Alive.
pub fn keep_alive() -> Sqe {
    Sqe::with_opcode(KEEP_ALIVE_OPCODE)
}

/// Fabrics fields of the Identify Controller page (bytes 1792..1804) and
/// its SUBNQN (768..1024): what a fabric host sizes its capsules with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricsIdentify {
    /// I/O Queue Command Capsule Supported Size, 16-byte units (SQE
    /// included).
    pub ioccsz: u32,
    /// I/O Queue Response Capsule Supported Size, 16-byte units.
    pub iorcsz: u32,
    /// In Capsule Data Offset, 16-byte units (0 for NVMe/TCP).
    pub icdoff: u16,
    /// Controller attributes (bit 0: static controller model).
    pub fcatt: u8,
    /// Maximum SGL data block descriptors.
    pub msdbd: u8,
    /// Subsystem NQN.
    pub subnqn: String,
}

/// Offset of IOCCSZ in Identify Controller.
pub const IDENTIFY_IOCCSZ: usize = 1792;
/// Offset of SUBNQN in Identify Controller.
pub const IDENTIFY_SUBNQN: usize = 768;

impl FabricsIdentify {
    /// Read the fields from a 4096-byte Identify Controller page (`None` if
    /// shorter).
    pub fn parse(page: &[u8]) -> Option<Self> {
        if page.len() < 4096 {
            return None;
        }
        let le32 =
            |at: usize| u32::from_le_bytes([page[at], page[at + 1], page[at + 2], page[at + 3]]);
        Some(FabricsIdentify {
            ioccsz: le32(IDENTIFY_IOCCSZ),
            iorcsz: le32(IDENTIFY_IOCCSZ + 4),
            icdoff: u16::from_le_bytes([page[1800], page[1801]]),
            fcatt: page[1802],
            msdbd: page[1803],
            subnqn: String::from_utf8_lossy(nqn_str(
                &page[IDENTIFY_SUBNQN..IDENTIFY_SUBNQN + NQN_BYTES],
            ))
            .into_owned(),
        })
    }
    /// In-capsule data bytes an I/O command may carry (IOCCSZ less the
    /// 64-byte SQE).
    pub const fn in_capsule_bytes(&self) -> u64 {
        (self.ioccsz as u64 * 16).saturating_sub(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_round_trips_and_lays_out() {
        let c = Connect {
            qid: 3,
            sqsize: 128,
            kato_ms: 5000,
        };
        let s = c.sqe();
        assert_eq!(s.opcode(), FABRICS_OPCODE);
        assert_eq!(s.fctype(), fctype::CONNECT);
        assert_eq!(s.cdw11, 127, "SQSIZE is 0's based");
        assert_eq!(Connect::from_sqe(&s), c);
        let d = ConnectData::new([7; 16], CNTLID_DYNAMIC, "nqn.sub", "nqn.host").unwrap();
        let b = d.to_bytes();
        assert_eq!(&b[16..18], &[0xFF, 0xFF]);
        assert_eq!(nqn_str(&b[256..512]), b"nqn.sub");
        assert_eq!(nqn_str(&b[512..768]), b"nqn.host");
        assert_eq!(ConnectData::from_bytes(&b), Some(d));
        assert!(ConnectData::from_bytes(&b[..1023]).is_none());
        assert_eq!(
            ConnectData::new([0; 16], 0, &"x".repeat(256), "h"),
            Err(NqnTooLong(256))
        );
    }

    #[test]
    fn properties_encode_offset_size_value() {
        let s = property_set(property::CC, PropertySize::Four, 0x46_0001);
        assert_eq!(s.fctype(), fctype::PROPERTY_SET);
        assert_eq!(property_fields(&s), (0x14, PropertySize::Four, 0x46_0001));
        let g = property_get(property::CAP, PropertySize::of(property::CAP));
        assert_eq!(property_fields(&g).0, 0);
        assert_eq!(property_fields(&g).1, PropertySize::Eight);
        let cqe = Cqe {
            dw0: 0x1234_5678,
            dw1: 0x9ABC_DEF0,
            ..Default::default()
        };
        assert_eq!(
            property_value(&cqe, PropertySize::Eight),
            0x9ABC_DEF0_1234_5678
        );
        assert_eq!(property_value(&cqe, PropertySize::Four), 0x1234_5678);
        assert_eq!(property::CSTS, 0x1C);
        assert_eq!(disconnect().fctype(), fctype::DISCONNECT);
        assert_eq!(keep_alive().opcode(), 0x18);
    }

    #[test]
    fn sgl_descriptors_in_sqe() {
        let s = Sqe::with_opcode(0x01).with_sgl(SglDescriptor::transport(8192));
        assert_eq!((s.cdw0 >> 14) & 0b11, 0b01, "PSDT = SGL");
        let d = SglDescriptor::from_sqe(&s);
        assert!(d.is_transport() && !d.is_in_capsule());
        assert_eq!(d.length, 8192);
        assert_eq!(s.prp2 >> 56, 0x5A);
        let s = Sqe::with_opcode(0x01).with_sgl(SglDescriptor::in_capsule(0, 512));
        let d = SglDescriptor::from_sqe(&s);
        assert!(d.is_in_capsule());
        assert_eq!((d.address, d.length, s.prp2 >> 56), (0, 512, 0x01));
    }

    #[test]
    fn fabrics_identify_fields() {
        let mut page = vec![0u8; 4096];
        page[1792..1796].copy_from_slice(&260u32.to_le_bytes());
        page[1796..1800].copy_from_slice(&1u32.to_le_bytes());
        page[768..776].copy_from_slice(b"nqn.test");
        let f = FabricsIdentify::parse(&page).unwrap();
        assert_eq!(f.in_capsule_bytes(), 260 * 16 - 64);
        assert_eq!(f.iorcsz, 1);
        assert_eq!(f.subnqn, "nqn.test");
        assert!(FabricsIdentify::parse(&page[..4095]).is_none());
    }
}
