//! The PDU headers as plain data (NVMe/TCP 1.0 section 3.6), their sizes
//! and constants, and the negotiated parameters the codec follows.

use std::mem::size_of;

use mcqio_vfio::PlainData;

use super::error::PduError;
use crate::nvme::spec::{Cqe, Sqe};
use crate::nvme::tcp::digest::Digests;

/// PDU type codes (the common header's `pdu_type`).
pub mod pdu_type {
    /// Initialize Connection Request (host to controller).
    pub const IC_REQ: u8 = 0x00;
    /// Initialize Connection Response (controller to host).
    pub const IC_RESP: u8 = 0x01;
    /// Host to Controller Terminate Connection Request.
    pub const H2C_TERM_REQ: u8 = 0x02;
    /// Controller to Host Terminate Connection Request.
    pub const C2H_TERM_REQ: u8 = 0x03;
    /// Command Capsule (host to controller).
    pub const CAPSULE_CMD: u8 = 0x04;
    /// Response Capsule (controller to host).
    pub const CAPSULE_RESP: u8 = 0x05;
    /// Host to Controller Data.
    pub const H2C_DATA: u8 = 0x06;
    /// Controller to Host Data.
    pub const C2H_DATA: u8 = 0x07;
    /// Ready to Transfer (controller to host).
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flags {
    /// HDGSTF: a header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// DDGSTF: a data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// LAST_PDU (H2CData, C2HData): the last data PDU of the transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// SUCCESS (C2HData, with LAST_PDU): the command succeeded and no
    /// CapsuleResp follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// Bytes of the common header.
pub const COMMON_HEADER_BYTES: usize = 8;
/// `hlen` (and `plen`) of ICReq and ICResp.
pub const IC_BYTES: usize = 128;
/// `hlen` of CapsuleCmd: the common header and the 64-byte SQE.
pub const CAPSULE_CMD_HLEN: usize = 72;
/// `hlen` of CapsuleResp: the common header and the 16-byte CQE.
pub const CAPSULE_RESP_HLEN: usize = 24;
/// `hlen` of H2CData, C2HData, R2T and TermReq.
pub const DATA_HLEN: usize = 24;
/// The longest TermReq PDU (its header and up to 128 bytes of the PDU
/// header that caused it).
pub const TERM_REQ_MAX_BYTES: usize = 152;
/// The only PDU format version (ICReq/ICResp `pfv`).
pub const PFV: u16 = 0;
/// The largest HPDA/CPDA (0's based dwords: 128-byte alignment).
pub const MAX_PDA: u8 = 31;
/// The smallest MAXH2CDATA a controller may advertise.
pub const MIN_MAXH2CDATA: u32 = 4096;

/// The alignment in bytes a PDA (0's based, in dwords) asks for.
pub const fn pda_alignment(pda: u8) -> usize {
    (pda as usize + 1) * 4
}

/// The common header of every PDU.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CommonHeader {
    /// PDU type ([`pdu_type`]).
    pub pdu_type: u8,
    /// Flags ([`flags`]).
    pub flags: u8,
    /// Header length: the common and PDU-specific header, no digest.
    pub hlen: u8,
    /// PDU data offset: where the data starts (0: no data).
    pub pdo: u8,
    /// PDU length: every byte of the PDU, digests and padding included.
    pub plen: u32,
}

/// ICReq: the host's connection parameters.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IcReq {
    /// Common header (type 0x00, hlen = plen = 128).
    pub ch: CommonHeader,
    /// PDU format version (0).
    pub pfv: u16,
    /// Host PDU data alignment (0's based dwords) for C2H data.
    pub hpda: u8,
    /// Digests asked for ([`Digests::to_byte`]).
    pub dgst: u8,
    /// Outstanding R2Ts per command the host accepts (0's based).
    pub maxr2t: u32,
    /// Reserved.
    pub rsvd: [u8; 112],
}

/// ICResp: the controller's answer.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IcResp {
    /// Common header (type 0x01, hlen = plen = 128).
    pub ch: CommonHeader,
    /// PDU format version (0).
    pub pfv: u16,
    /// Controller PDU data alignment (0's based dwords) for H2C data.
    pub cpda: u8,
    /// Digests granted.
    pub dgst: u8,
    /// The most data one H2CData PDU may carry.
    pub maxh2cdata: u32,
    /// Reserved.
    pub rsvd: [u8; 112],
}

/// The header of a CapsuleCmd.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CapsuleCmdHeader {
    /// Common header (type 0x04, hlen 72).
    pub ch: CommonHeader,
    /// The submission queue entry.
    pub sqe: Sqe,
}

/// The header of a CapsuleResp.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CapsuleRespHeader {
    /// Common header (type 0x05, hlen 24).
    pub ch: CommonHeader,
    /// The completion queue entry.
    pub cqe: Cqe,
}

/// The header of H2CData and C2HData.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DataHeader {
    /// Common header (type 0x06 or 0x07, hlen 24).
    pub ch: CommonHeader,
    /// Command capsule CID of the command the data belongs to.
    pub cccid: u16,
    /// Transfer tag from the R2T (H2CData; reserved in C2HData).
    pub ttag: u16,
    /// Data offset within the command's transfer.
    pub datao: u32,
    /// Data length of this PDU.
    pub datal: u32,
    /// Reserved.
    pub rsvd: u32,
}

/// The header of R2T.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct R2tHeader {
    /// Common header (type 0x09, hlen 24).
    pub ch: CommonHeader,
    /// Command capsule CID of the write.
    pub cccid: u16,
    /// Transfer tag the host echoes in its H2CData.
    pub ttag: u16,
    /// Offset of the requested data within the command's transfer.
    pub r2to: u32,
    /// Bytes requested.
    pub r2tl: u32,
    /// Reserved.
    pub rsvd: u32,
}

/// The header of H2CTermReq and C2HTermReq.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TermReqHeader {
    /// Common header (type 0x02 or 0x03, hlen 24).
    pub ch: CommonHeader,
    /// Fatal error status ([`fes`](super::fes)).
    pub fes: u16,
    /// Fatal error information (little-endian; the byte offset of the
    /// field for FES 1 and 6).
    pub fei: [u8; 4],
    /// Reserved.
    pub rsvd: [u8; 10],
}

const _: () = assert!(size_of::<CommonHeader>() == COMMON_HEADER_BYTES);
const _: () = assert!(size_of::<IcReq>() == IC_BYTES && size_of::<IcResp>() == IC_BYTES);
const _: () = assert!(std::mem::offset_of!(IcReq, maxr2t) == 12);
const _: () = assert!(std::mem::offset_of!(IcResp, maxh2cdata) == 12);
const _: () = assert!(size_of::<CapsuleCmdHeader>() == CAPSULE_CMD_HLEN);
const _: () = assert!(std::mem::offset_of!(CapsuleCmdHeader, sqe) == 8);
const _: () = assert!(size_of::<CapsuleRespHeader>() == CAPSULE_RESP_HLEN);
const _: () = assert!(size_of::<DataHeader>() == DATA_HLEN);
const _: () = assert!(std::mem::offset_of!(DataHeader, datal) == 16);
const _: () = assert!(size_of::<R2tHeader>() == DATA_HLEN);
const _: () = assert!(std::mem::offset_of!(R2tHeader, r2tl) == 16);
const _: () = assert!(size_of::<TermReqHeader>() == DATA_HLEN);
const _: () = assert!(std::mem::offset_of!(TermReqHeader, fei) == 10);

// The eight headers below: `#[repr(C)]`, integers and byte arrays only,
// no padding (the sizes are asserted above to be the sums of the fields).
// SAFETY: so every bit pattern is a valid value.
unsafe impl PlainData for CommonHeader {}
// SAFETY: as above.
unsafe impl PlainData for IcReq {}
// SAFETY: as above.
unsafe impl PlainData for IcResp {}
// SAFETY: as above.
unsafe impl PlainData for CapsuleCmdHeader {}
// SAFETY: as above.
unsafe impl PlainData for CapsuleRespHeader {}
// SAFETY: as above.
unsafe impl PlainData for DataHeader {}
// SAFETY: as above.
unsafe impl PlainData for R2tHeader {}
// SAFETY: as above.
unsafe impl PlainData for TermReqHeader {}

/// Read a `T` from the start of `b`, or `None` if `b` is shorter.
#[inline]
pub(super) fn read_plain<T: PlainData>(b: &[u8]) -> Option<T> {
    if b.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: `b` holds at least `size_of::<T>()` bytes (checked above);
    // `read_unaligned` has no alignment requirement; `T: PlainData`, so
    // any bytes are a valid `T`. Wire structs are little-endian and so is
    // the host (`nvme::spec` refuses big-endian builds).
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) })
}

/// Copy the bytes of `v` to the start of `out` (which the caller sized).
#[inline]
pub(super) fn write_plain<T: PlainData>(v: &T, out: &mut [u8]) {
    // SAFETY: `T: PlainData` has no padding, so all `size_of::<T>()` bytes
    // behind `v` are initialised; the slice lives no longer than `v`.
    let bytes = unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) };
    out[..bytes.len()].copy_from_slice(bytes);
}

/// Who sends the PDUs being parsed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Controller to host: the host parses ICResp, C2HTermReq,
    /// CapsuleResp, C2HData, R2T.
    ControllerToHost,
    /// Host to controller: a controller parses ICReq, H2CTermReq,
    /// CapsuleCmd, H2CData.
    HostToController,
}

/// What the connection agreed in ICReq/ICResp: what the parser checks and
/// the builders write. [`Negotiated::INITIAL`] is the state before
/// ICResp (no digests, 4-byte alignment).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The digests in use.
    pub digests: Digests,
    /// Host PDU data alignment (0's based dwords): C2H data starts at a
    /// multiple of it.
    pub hpda: u8,
    /// Controller PDU data alignment: H2C data (in-capsule included)
    /// starts at a multiple of it.
    pub cpda: u8,
    /// The most data one PDU may carry that this side accepts (the
    /// parser's `plen` bound): the largest read/in-capsule transfer for a
    /// host, MAXH2CDATA or IOCCSZ for a controller.
    pub max_data: u32,
}

impl Negotiated {
    /// Before ICResp: no digests, no alignment, no data PDUs expected.
    pub const INITIAL: Negotiated = Negotiated {
        digests: Digests::NONE,
        hpda: 0,
        cpda: 0,
        max_data: 0,
    };

    /// What a host runs with after ICResp: the digests granted (which must
    /// be among those it asked for), its own HPDA, the controller's CPDA,
    /// and `max_data` (the largest data PDU it accepts). MAXH2CDATA stays in
    /// `resp` (the limit on what the host sends).
    pub fn for_host(
        asked: Digests,
        hpda: u8,
        resp: &IcResp,
        max_data: u32,
    ) -> Result<Self, PduError> {
        let granted = Digests::from_byte(resp.dgst);
        if (granted.header && !asked.header)
            || (granted.data && !asked.data)
            || resp.dgst & !0b11 != 0
        {
            return Err(PduError::DigestNotAsked {
                asked: asked.to_byte(),
                granted: resp.dgst,
            });
        }
        Ok(Negotiated {
            digests: granted,
            hpda,
            cpda: resp.cpda,
            max_data,
        })
    }

    /// The PDA that data sent in `direction` is aligned to.
    pub const fn pda(&self, direction: Direction) -> u8 {
        match direction {
            Direction::ControllerToHost => self.hpda,
            Direction::HostToController => self.cpda,
        }
    }
}

/// Where the parts of one PDU go ([`PduLayout::new`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PduLayout {
    /// Header length.
    pub hlen: usize,
    /// Header plus header digest.
    pub header_end: usize,
    /// Data offset (0 without data).
    pub pdo: usize,
    /// Data bytes.
    pub data_len: usize,
    /// The whole PDU.
    pub plen: usize,
}

impl PduLayout {
    /// The layout of a PDU of header length `hlen` with `data_len` bytes of
    /// data, sent with `digests` and data aligned to `pda`. `None` if the
    /// PDU cannot be described (PDO past 255, PLEN past `u32`).
    pub fn new(
        hlen: usize,
        data_len: usize,
        digests: Digests,
        pda: u8,
        digest_header: bool,
    ) -> Option<Self> {
        let header_end = hlen
            + if digest_header {
                digests.header_len()
            } else {
                0
            };
        if data_len == 0 {
            return Some(PduLayout {
                hlen,
                header_end,
                pdo: 0,
                data_len: 0,
                plen: header_end,
            });
        }
        let align = pda_alignment(pda);
        let pdo = header_end.div_ceil(align) * align;
        if pdo > u8::MAX as usize {
            return None;
        }
        let plen = pdo.checked_add(data_len)?.checked_add(digests.data_len())?;
        if plen > u32::MAX as usize {
            return None;
        }
        Some(PduLayout {
            hlen,
            header_end,
            pdo,
            data_len,
            plen,
        })
    }
}
