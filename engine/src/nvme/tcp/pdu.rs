//! NVMe/TCP PDUs: wire structs, the in-place parser and the builders.
//!
//! Every PDU starts with the 8-byte [`CommonHeader`]: `pdu_type`, `flags`,
//! `hlen` (the PDU-specific header length, fixed per type), `pdo` (where
//! the data starts, 0 when there is none) and `plen` (the whole PDU:
//! header, header digest, padding, data, data digest). The layout of a PDU
//! with data is
//!
//! ```text
//! | header (hlen) | HDGST? | pad to pdo | data | DDGST? |
//! 0              hlen                  pdo           plen
//! ```
//!
//! [`parse`] takes the bytes received so far and returns
//! [`Parse::Incomplete`] with the total it needs, or one [`Pdu`] that
//! borrows its data from the buffer (no copy) and the bytes it used. It
//! checks the common header as soon as 8 bytes are there — type, direction,
//! `hlen` for the type, `plen` against the largest PDU the connection
//! accepts, `pdo` against the header, the digests and the alignment — so a
//! hostile `plen` is refused before we wait for (or slice) bytes that will
//! never come. The digests are checked once the PDU is whole.
//!
//! Builders (`write_*`) put a PDU into a caller's buffer and return its
//! length; none allocates. [`PduLayout`] gives the offsets for a vectored
//! send that keeps the data in the caller's buffer
//! ([`write_capsule_cmd_header`], [`write_data_header`],
//! [`data_digest_bytes`]).

use std::mem::size_of;

use mcqio_vfio::PlainData;

use super::digest::{crc32c, Digests, DIGEST_BYTES};
use crate::nvme::spec::{Cqe, Sqe};

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

/// Fatal Error Status codes of H2CTermReq/C2HTermReq.
pub mod fes {
    /// Invalid PDU Header Field (FEI: the byte offset of the field).
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    /// PDU Sequence Error.
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    /// Header Digest Error.
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    /// Data Transfer Out of Range.
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    /// R2T Limit Exceeded.
    pub const R2T_LIMIT_EXCEEDED: u16 = 0x05;
    /// Unsupported Parameter (FEI: the byte offset of the field).
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
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
    /// Fatal error status ([`fes`]).
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
fn read_plain<T: PlainData>(b: &[u8]) -> Option<T> {
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
fn write_plain<T: PlainData>(v: &T, out: &mut [u8]) {
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

/// A malformed PDU, or one this side must not receive. Each ends the
/// connection; [`PduError::fes`] gives the TermReq to answer with.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// A `pdu_type` the protocol does not define.
    #[error("unknown PDU type {0:#04x}")]
    UnknownType(u8),
    /// A PDU type the peer must not send in this direction.
    #[error("PDU type {0:#04x} is not valid in this direction")]
    WrongDirection(u8),
    /// `hlen` is not the fixed header length of the type.
    #[error("PDU type {pdu_type:#04x} with HLEN {hlen} (must be {expected})")]
    BadHlen {
        /// The type.
        pdu_type: u8,
        /// What the PDU said.
        hlen: u8,
        /// The length for the type.
        expected: u8,
    },
    /// `plen` is shorter than the header (and its digest) it must hold.
    #[error("PLEN {plen} is shorter than the {min}-byte header")]
    PlenTooSmall {
        /// What the PDU said.
        plen: u32,
        /// The least the type needs.
        min: u32,
    },
    /// `plen` is larger than any PDU this connection accepts (an overflow
    /// or a lie: refused before waiting for the bytes).
    #[error("PLEN {plen} exceeds the {max}-byte limit of this connection")]
    PlenTooLarge {
        /// What the PDU said.
        plen: u32,
        /// The limit.
        max: u32,
    },
    /// `plen` does not match a PDU type that has a fixed length or no data.
    #[error("PDU type {pdu_type:#04x} with PLEN {plen} (must be {expected})")]
    BadPlen {
        /// The type.
        pdu_type: u8,
        /// What the PDU said.
        plen: u32,
        /// The length the type and digests give.
        expected: u32,
    },
    /// `pdo` points into the header or its digest.
    #[error("PDO {pdo} lies inside the {header_end}-byte header")]
    PdoInsideHeader {
        /// What the PDU said.
        pdo: u8,
        /// Header plus header digest.
        header_end: u32,
    },
    /// `pdo` leaves no room for data (and its digest) before `plen`.
    #[error("PDO {pdo} is at or past the end of the data (PLEN {plen})")]
    PdoPastEnd {
        /// What the PDU said.
        pdo: u8,
        /// What the PDU said.
        plen: u32,
    },
    /// `pdo` is not a multiple of the negotiated alignment.
    #[error("PDO {pdo} is not a multiple of the {alignment}-byte PDU data alignment")]
    PdoMisaligned {
        /// What the PDU said.
        pdo: u8,
        /// The negotiated alignment in bytes.
        alignment: u32,
    },
    /// HDGSTF set without a negotiated header digest, or missing with one.
    #[error("HDGSTF is {flag} but header digests are {negotiated}", flag = on_off(*.flag), negotiated = on_off(*.negotiated))]
    HeaderDigestFlag {
        /// The flag in the PDU.
        flag: bool,
        /// What was negotiated.
        negotiated: bool,
    },
    /// DDGSTF set without a negotiated data digest (or on a PDU without
    /// data), or missing with one.
    #[error("DDGSTF is {flag} but data digests are {negotiated}", flag = on_off(*.flag), negotiated = on_off(*.negotiated))]
    DataDigestFlag {
        /// The flag in the PDU.
        flag: bool,
        /// What applies to this PDU.
        negotiated: bool,
    },
    /// A data PDU whose `datal` is not the data it carries.
    #[error("DATAL {datal} but the PDU carries {carried} data bytes")]
    DatalMismatch {
        /// What the header said.
        datal: u32,
        /// What `plen` and `pdo` leave.
        carried: u32,
    },
    /// A data PDU or R2T that moves no bytes.
    #[error("PDU type {0:#04x} with a zero data length")]
    ZeroLength(u8),
    /// SUCCESS without LAST_PDU on a C2HData.
    #[error("C2HData with SUCCESS but not LAST_PDU")]
    SuccessWithoutLast,
    /// The header digest does not match the header.
    #[error("header digest {received:#010x}, computed {computed:#010x}")]
    HeaderDigest {
        /// The digest in the PDU.
        received: u32,
        /// The digest of the received header.
        computed: u32,
    },
    /// The data digest does not match the data.
    #[error("data digest {received:#010x}, computed {computed:#010x}")]
    DataDigest {
        /// The digest in the PDU.
        received: u32,
        /// The digest of the received data.
        computed: u32,
    },
    /// ICReq/ICResp with a PDU format version other than 0.
    #[error("unsupported PDU format version {0}")]
    UnsupportedPfv(u16),
    /// HPDA/CPDA above 31.
    #[error("PDU data alignment {0} above the maximum 31")]
    BadPda(u8),
    /// ICResp grants a digest the host did not ask for (or sets reserved
    /// bits of DGST).
    #[error("ICResp grants digests {granted:#04x}, the host asked for {asked:#04x}")]
    DigestNotAsked {
        /// DGST of the ICReq.
        asked: u8,
        /// DGST of the ICResp.
        granted: u8,
    },
    /// MAXH2CDATA below 4096 or not a multiple of 4.
    #[error("MAXH2CDATA {0} (must be a multiple of 4, at least 4096)")]
    BadMaxH2cData(u32),
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

impl PduError {
    /// The TermReq this error calls for: FES and FEI (for a header field,
    /// its byte offset in the PDU).
    pub const fn fes(&self) -> (u16, u32) {
        match self {
            PduError::UnknownType(_) | PduError::WrongDirection(_) => {
                (fes::INVALID_HEADER_FIELD, 0)
            }
            PduError::HeaderDigestFlag { .. } | PduError::DataDigestFlag { .. } => {
                (fes::INVALID_HEADER_FIELD, 1)
            }
            PduError::SuccessWithoutLast => (fes::INVALID_HEADER_FIELD, 1),
            PduError::BadHlen { .. } => (fes::INVALID_HEADER_FIELD, 2),
            PduError::PdoInsideHeader { .. }
            | PduError::PdoPastEnd { .. }
            | PduError::PdoMisaligned { .. } => (fes::INVALID_HEADER_FIELD, 3),
            PduError::PlenTooSmall { .. } | PduError::BadPlen { .. } => {
                (fes::INVALID_HEADER_FIELD, 4)
            }
            PduError::PlenTooLarge { .. } => (fes::DATA_OUT_OF_RANGE, 4),
            PduError::DatalMismatch { .. } | PduError::ZeroLength(_) => {
                (fes::INVALID_HEADER_FIELD, 16)
            }
            PduError::HeaderDigest { .. } => (fes::HEADER_DIGEST_ERROR, 0),
            // A data digest error is not fatal to the connection in the
            // spec's view (the command fails); a wire may still choose to
            // end it. There is no FES for it: report the sequence broken.
            PduError::DataDigest { .. } => (fes::PDU_SEQUENCE_ERROR, 0),
            PduError::UnsupportedPfv(_) => (fes::UNSUPPORTED_PARAMETER, 8),
            PduError::BadPda(_) => (fes::UNSUPPORTED_PARAMETER, 10),
            PduError::DigestNotAsked { .. } => (fes::UNSUPPORTED_PARAMETER, 11),
            PduError::BadMaxH2cData(_) => (fes::UNSUPPORTED_PARAMETER, 12),
        }
    }
}

/// A builder's buffer is too small, or the PDU cannot be described.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The output buffer holds fewer bytes than the PDU needs.
    #[error("PDU needs {need} bytes, the buffer has {have}")]
    BufferTooSmall {
        /// The PDU's length.
        need: usize,
        /// The buffer's length.
        have: usize,
    },
    /// The data does not fit one PDU (PLEN past `u32`, or a TermReq's
    /// copied header past 128 bytes).
    #[error("{0} data bytes do not fit one PDU")]
    DataTooLarge(usize),
    /// An ICReq/ICResp parameter out of its range (PDA above 31).
    #[error("PDU data alignment {0} above the maximum 31")]
    BadPda(u8),
}

/// One parsed PDU; data borrows the receive buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Pdu<'a> {
    /// ICReq.
    IcReq(IcReq),
    /// ICResp (PFV, CPDA and MAXH2CDATA checked).
    IcResp(IcResp),
    /// H2CTermReq or C2HTermReq.
    TermReq {
        /// [`pdu_type::H2C_TERM_REQ`] or [`pdu_type::C2H_TERM_REQ`].
        pdu_type: u8,
        /// Fatal error status ([`fes`]).
        fes: u16,
        /// Fatal error information.
        fei: u32,
        /// The copy of the offending PDU header, if any.
        header: &'a [u8],
    },
    /// CapsuleCmd with its in-capsule data (possibly empty).
    CapsuleCmd {
        /// The command.
        sqe: Sqe,
        /// In-capsule data.
        data: &'a [u8],
    },
    /// CapsuleResp.
    CapsuleResp {
        /// The completion.
        cqe: Cqe,
    },
    /// H2CData or C2HData (`datal` is `data.len()`, checked).
    Data {
        /// [`pdu_type::H2C_DATA`] or [`pdu_type::C2H_DATA`].
        pdu_type: u8,
        /// CID of the command.
        cccid: u16,
        /// Transfer tag (H2CData).
        ttag: u16,
        /// Offset of `data` in the command's transfer.
        datao: u32,
        /// LAST_PDU.
        last: bool,
        /// SUCCESS (C2HData only).
        success: bool,
        /// The data.
        data: &'a [u8],
    },
    /// R2T.
    R2t {
        /// CID of the write.
        cccid: u16,
        /// Transfer tag.
        ttag: u16,
        /// Offset asked for.
        r2to: u32,
        /// Bytes asked for (never 0).
        r2tl: u32,
    },
}

/// What [`parse`] found at the start of the buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Parse<'a> {
    /// Not a whole PDU yet: `need` bytes in all are required (8 until the
    /// common header is in, then `plen`).
    Incomplete {
        /// The total buffer length the next step needs.
        need: usize,
    },
    /// One PDU, `len` bytes long (drop them from the buffer after use).
    Complete {
        /// The PDU.
        pdu: Pdu<'a>,
        /// Bytes consumed.
        len: usize,
    },
}

/// The fixed header length of a PDU type.
pub const fn hlen_of(pdu_type: u8) -> Option<u8> {
    match pdu_type {
        pdu_type::IC_REQ | pdu_type::IC_RESP => Some(IC_BYTES as u8),
        pdu_type::CAPSULE_CMD => Some(CAPSULE_CMD_HLEN as u8),
        pdu_type::CAPSULE_RESP => Some(CAPSULE_RESP_HLEN as u8),
        pdu_type::H2C_TERM_REQ
        | pdu_type::C2H_TERM_REQ
        | pdu_type::H2C_DATA
        | pdu_type::C2H_DATA
        | pdu_type::R2T => Some(DATA_HLEN as u8),
        _ => None,
    }
}

const fn sent_by(pdu_type: u8) -> Direction {
    match pdu_type {
        pdu_type::IC_REQ | pdu_type::H2C_TERM_REQ | pdu_type::CAPSULE_CMD | pdu_type::H2C_DATA => {
            Direction::HostToController
        }
        _ => Direction::ControllerToHost,
    }
}

/// Whether the type carries a header digest when one is negotiated.
const fn has_header_digest(pdu_type: u8) -> bool {
    !matches!(
        pdu_type,
        pdu_type::IC_REQ | pdu_type::IC_RESP | pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ
    )
}

/// Whether the type may carry data (and so a data digest).
const fn may_carry_data(pdu_type: u8) -> bool {
    matches!(
        pdu_type,
        pdu_type::CAPSULE_CMD | pdu_type::H2C_DATA | pdu_type::C2H_DATA
    )
}

#[inline]
fn le32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// The checks that need only the common header: everything about lengths
/// and offsets. Returns the data range (`pdo..pdo + data_len`; empty at
/// `header_end` without data) and the header end.
fn check_header(
    ch: &CommonHeader,
    direction: Direction,
    neg: &Negotiated,
) -> Result<(usize, usize, usize), PduError> {
    let t = ch.pdu_type;
    let Some(hlen) = hlen_of(t) else {
        return Err(PduError::UnknownType(t));
    };
    if sent_by(t) != direction {
        return Err(PduError::WrongDirection(t));
    }
    if ch.hlen != hlen {
        return Err(PduError::BadHlen {
            pdu_type: t,
            hlen: ch.hlen,
            expected: hlen,
        });
    }
    let plen = ch.plen;
    let hlen = hlen as usize;
    let hdgst = has_header_digest(t) && neg.digests.header;
    if has_header_digest(t) {
        let flag = ch.flags & flags::HDGSTF != 0;
        if flag != hdgst {
            return Err(PduError::HeaderDigestFlag {
                flag,
                negotiated: hdgst,
            });
        }
    } else if ch.flags & (flags::HDGSTF | flags::DDGSTF) != 0 {
        return Err(PduError::HeaderDigestFlag {
            flag: true,
            negotiated: false,
        });
    }
    let header_end = hlen + if hdgst { DIGEST_BYTES } else { 0 };
    if (plen as usize) < header_end {
        return Err(PduError::PlenTooSmall {
            plen,
            min: header_end as u32,
        });
    }
    match t {
        pdu_type::IC_REQ | pdu_type::IC_RESP | pdu_type::CAPSULE_RESP | pdu_type::R2T => {
            if plen as usize != header_end {
                return Err(PduError::BadPlen {
                    pdu_type: t,
                    plen,
                    expected: header_end as u32,
                });
            }
            return Ok((header_end, 0, header_end));
        }
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => {
            if plen as usize > TERM_REQ_MAX_BYTES {
                return Err(PduError::PlenTooLarge {
                    plen,
                    max: TERM_REQ_MAX_BYTES as u32,
                });
            }
            // The copied header sits right after ours; PDO is reserved.
            return Ok((header_end, plen as usize - header_end, header_end));
        }
        _ => {}
    }
    debug_assert!(may_carry_data(t));
    let ddgst_flag = ch.flags & flags::DDGSTF != 0;
    if plen as usize == header_end {
        // No data (a CapsuleCmd without in-capsule data; data PDUs must
        // carry some, checked by the caller through `datal`).
        if ddgst_flag {
            return Err(PduError::DataDigestFlag {
                flag: true,
                negotiated: false,
            });
        }
        return Ok((header_end, 0, header_end));
    }
    if ddgst_flag != neg.digests.data {
        return Err(PduError::DataDigestFlag {
            flag: ddgst_flag,
            negotiated: neg.digests.data,
        });
    }
    let ddgst = neg.digests.data_len();
    let max = PduLayout::new(
        hlen,
        neg.max_data as usize,
        neg.digests,
        neg.pda(direction),
        true,
    )
    .map_or(u32::MAX, |l| l.plen as u32);
    if plen > max {
        return Err(PduError::PlenTooLarge { plen, max });
    }
    let pdo = ch.pdo as usize;
    if pdo < header_end {
        return Err(PduError::PdoInsideHeader {
            pdo: ch.pdo,
            header_end: header_end as u32,
        });
    }
    let align = pda_alignment(neg.pda(direction));
    if pdo % align != 0 {
        return Err(PduError::PdoMisaligned {
            pdo: ch.pdo,
            alignment: align as u32,
        });
    }
    if pdo + ddgst >= plen as usize {
        return Err(PduError::PdoPastEnd { pdo: ch.pdo, plen });
    }
    Ok((pdo, plen as usize - ddgst - pdo, header_end))
}

/// A PDU header that passed every check [`parse`] makes before the data:
/// where the data and its digest lie, for a receiver that places the data
/// itself ([`parse_header`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The common header.
    pub ch: CommonHeader,
    /// Header plus header digest.
    pub header_end: usize,
    /// Where the data starts (`pdo`; `header_end` without data).
    pub data_at: usize,
    /// Data bytes (`datal` for data PDUs, checked).
    pub data_len: usize,
    /// The data digest follows the data.
    pub data_digest: bool,
    /// The whole PDU.
    pub plen: usize,
}

impl Header {
    /// The H2CData/C2HData header fields, if this is one (`buf` holds at
    /// least `header_end` bytes, as [`parse_header`] checked).
    pub fn data_header(&self, buf: &[u8]) -> Option<DataHeader> {
        matches!(self.ch.pdu_type, pdu_type::H2C_DATA | pdu_type::C2H_DATA)
            .then(|| read_plain::<DataHeader>(buf))
            .flatten()
    }
}

/// Check the PDU header at the start of `buf` as soon as the header (and
/// its digest) is in, without waiting for the data: `Ok(None)` until then.
/// Everything [`parse`] checks except the data digest is checked here, so
/// a receiver can read the data of a large C2HData straight into the
/// command's buffer (`data_len` bytes from `data_at`, then the digest,
/// checked with [`super::digest::DataDigest`]).
pub fn parse_header(
    buf: &[u8],
    direction: Direction,
    neg: &Negotiated,
) -> Result<Option<Header>, PduError> {
    let Some(ch) = read_plain::<CommonHeader>(buf) else {
        return Ok(None);
    };
    let (data_at, data_len, header_end) = check_header(&ch, direction, neg)?;
    if buf.len() < header_end {
        return Ok(None);
    }
    let hlen = ch.hlen as usize;
    if header_end > hlen {
        let received = le32(buf, hlen);
        let computed = crc32c(&buf[..hlen]);
        if received != computed {
            return Err(PduError::HeaderDigest { received, computed });
        }
    }
    if matches!(ch.pdu_type, pdu_type::H2C_DATA | pdu_type::C2H_DATA) {
        let h: DataHeader = read_plain(buf).ok_or(PduError::PlenTooSmall {
            plen: ch.plen,
            min: DATA_HLEN as u32,
        })?;
        check_data_header(&ch, &h, data_len)?;
    }
    Ok(Some(Header {
        ch,
        header_end,
        data_at,
        data_len,
        data_digest: data_len > 0 && ch.flags & flags::DDGSTF != 0 && may_carry_data(ch.pdu_type),
        plen: ch.plen as usize,
    }))
}

fn check_data_header(ch: &CommonHeader, h: &DataHeader, data_len: usize) -> Result<(), PduError> {
    if h.datal as usize != data_len {
        return Err(PduError::DatalMismatch {
            datal: h.datal,
            carried: data_len as u32,
        });
    }
    if data_len == 0 {
        return Err(PduError::ZeroLength(ch.pdu_type));
    }
    let last = ch.flags & flags::LAST_PDU != 0;
    if ch.pdu_type == pdu_type::C2H_DATA && ch.flags & flags::SUCCESS != 0 && !last {
        return Err(PduError::SuccessWithoutLast);
    }
    Ok(())
}

/// Parse the PDU at the start of `buf` (the bytes received so far, from a
/// PDU boundary), sent in `direction`, under `neg`. See the module docs.
pub fn parse<'a>(
    buf: &'a [u8],
    direction: Direction,
    neg: &Negotiated,
) -> Result<Parse<'a>, PduError> {
    let Some(ch) = read_plain::<CommonHeader>(buf) else {
        return Ok(Parse::Incomplete {
            need: COMMON_HEADER_BYTES,
        });
    };
    let (data_at, data_len, header_end) = check_header(&ch, direction, neg)?;
    let plen = ch.plen as usize;
    if buf.len() < plen {
        return Ok(Parse::Incomplete { need: plen });
    }
    let pdu = &buf[..plen];
    let hlen = ch.hlen as usize;
    if header_end > hlen {
        let received = le32(pdu, hlen);
        let computed = crc32c(&pdu[..hlen]);
        if received != computed {
            return Err(PduError::HeaderDigest { received, computed });
        }
    }
    let data = &pdu[data_at..data_at + data_len];
    if data_len > 0 && ch.flags & flags::DDGSTF != 0 && may_carry_data(ch.pdu_type) {
        let received = le32(pdu, data_at + data_len);
        let computed = crc32c(data);
        if received != computed {
            return Err(PduError::DataDigest { received, computed });
        }
    }
    let parsed = match ch.pdu_type {
        pdu_type::IC_REQ => {
            let r: IcReq = read_plain(pdu).ok_or(PduError::PlenTooSmall {
                plen: ch.plen,
                min: IC_BYTES as u32,
            })?;
            check_ic(r.pfv, r.hpda)?;
            Pdu::IcReq(r)
        }
        pdu_type::IC_RESP => {
            let r: IcResp = read_plain(pdu).ok_or(PduError::PlenTooSmall {
                plen: ch.plen,
                min: IC_BYTES as u32,
            })?;
            check_ic(r.pfv, r.cpda)?;
            if r.maxh2cdata < MIN_MAXH2CDATA || r.maxh2cdata % 4 != 0 {
                return Err(PduError::BadMaxH2cData(r.maxh2cdata));
            }
            Pdu::IcResp(r)
        }
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => {
            let h: TermReqHeader = read_plain(pdu).ok_or(PduError::PlenTooSmall {
                plen: ch.plen,
                min: DATA_HLEN as u32,
            })?;
            Pdu::TermReq {
                pdu_type: ch.pdu_type,
                fes: h.fes,
                fei: u32::from_le_bytes(h.fei),
                header: data,
            }
        }
        pdu_type::CAPSULE_CMD => {
            let h: CapsuleCmdHeader = read_plain(pdu).ok_or(PduError::PlenTooSmall {
                plen: ch.plen,
                min: CAPSULE_CMD_HLEN as u32,
            })?;
            Pdu::CapsuleCmd { sqe: h.sqe, data }
        }
        pdu_type::CAPSULE_RESP => {
            let h: CapsuleRespHeader = read_plain(pdu).ok_or(PduError::PlenTooSmall {
                plen: ch.plen,
                min: CAPSULE_RESP_HLEN as u32,
            })?;
            Pdu::CapsuleResp { cqe: h.cqe }
        }
        pdu_type::H2C_DATA | pdu_type::C2H_DATA => {
            let h: DataHeader = read_plain(pdu).ok_or(PduError::PlenTooSmall {
                plen: ch.plen,
                min: DATA_HLEN as u32,
            })?;
            check_data_header(&ch, &h, data_len)?;
            let last = ch.flags & flags::LAST_PDU != 0;
            let success = ch.pdu_type == pdu_type::C2H_DATA && ch.flags & flags::SUCCESS != 0;
            Pdu::Data {
                pdu_type: ch.pdu_type,
                cccid: h.cccid,
                ttag: h.ttag,
                datao: h.datao,
                last,
                success,
                data,
            }
        }
        pdu_type::R2T => {
            let h: R2tHeader = read_plain(pdu).ok_or(PduError::PlenTooSmall {
                plen: ch.plen,
                min: DATA_HLEN as u32,
            })?;
            if h.r2tl == 0 {
                return Err(PduError::ZeroLength(ch.pdu_type));
            }
            Pdu::R2t {
                cccid: h.cccid,
                ttag: h.ttag,
                r2to: h.r2to,
                r2tl: h.r2tl,
            }
        }
        other => return Err(PduError::UnknownType(other)),
    };
    Ok(Parse::Complete {
        pdu: parsed,
        len: plen,
    })
}

fn check_ic(pfv: u16, pda: u8) -> Result<(), PduError> {
    if pfv != PFV {
        return Err(PduError::UnsupportedPfv(pfv));
    }
    if pda > MAX_PDA {
        return Err(PduError::BadPda(pda));
    }
    Ok(())
}

fn room(out: &[u8], need: usize) -> Result<(), BuildError> {
    if out.len() < need {
        Err(BuildError::BufferTooSmall {
            need,
            have: out.len(),
        })
    } else {
        Ok(())
    }
}

/// Write the common header at the start of `out`, then the header digest
/// and zero padding up to `layout.pdo`, given the rest of the header is
/// already at `out[8..hlen]`.
fn finish_header(
    out: &mut [u8],
    pdu_type: u8,
    extra_flags: u8,
    layout: &PduLayout,
    digests: Digests,
    hdgst: bool,
) {
    let mut f = extra_flags;
    if hdgst && digests.header {
        f |= flags::HDGSTF;
    }
    if layout.data_len > 0 && digests.data {
        f |= flags::DDGSTF;
    }
    let ch = CommonHeader {
        pdu_type,
        flags: f,
        hlen: layout.hlen as u8,
        pdo: layout.pdo as u8,
        plen: layout.plen as u32,
    };
    write_plain(&ch, out);
    if layout.header_end > layout.hlen {
        let d = crc32c(&out[..layout.hlen]);
        out[layout.hlen..layout.header_end].copy_from_slice(&d.to_le_bytes());
    }
    if layout.pdo > layout.header_end {
        out[layout.header_end..layout.pdo].fill(0);
    }
}

/// The data digest of `data`, as the 4 bytes that follow it on the wire.
pub fn data_digest_bytes(data: &[u8]) -> [u8; 4] {
    crc32c(data).to_le_bytes()
}

/// Write a whole PDU (header, digests, padding, `data`) into `out`.
fn write_whole(
    out: &mut [u8],
    pdu_type: u8,
    extra_flags: u8,
    header: &[u8],
    data: &[u8],
    digests: Digests,
    pda: u8,
) -> Result<usize, BuildError> {
    let hdgst = has_header_digest(pdu_type);
    let layout = PduLayout::new(header.len(), data.len(), digests, pda, hdgst)
        .ok_or(BuildError::DataTooLarge(data.len()))?;
    room(out, layout.plen)?;
    out[COMMON_HEADER_BYTES..layout.hlen].copy_from_slice(&header[COMMON_HEADER_BYTES..]);
    finish_header(out, pdu_type, extra_flags, &layout, digests, hdgst);
    if !data.is_empty() {
        out[layout.pdo..layout.pdo + data.len()].copy_from_slice(data);
        if digests.data {
            let at = layout.pdo + data.len();
            out[at..at + DIGEST_BYTES].copy_from_slice(&data_digest_bytes(data));
        }
    }
    Ok(layout.plen)
}

fn bytes_of<T: PlainData, const N: usize>(v: &T) -> [u8; N] {
    let mut b = [0u8; N];
    write_plain(v, &mut b);
    b
}

/// Write an ICReq: `hpda` (0's based dwords), the digests asked for and
/// `maxr2t` (0's based). Returns 128.
pub fn write_ic_req(
    out: &mut [u8],
    hpda: u8,
    digests: Digests,
    maxr2t: u32,
) -> Result<usize, BuildError> {
    if hpda > MAX_PDA {
        return Err(BuildError::BadPda(hpda));
    }
    let r = IcReq {
        ch: CommonHeader::default(),
        pfv: PFV,
        hpda,
        dgst: digests.to_byte(),
        maxr2t,
        rsvd: [0; 112],
    };
    write_whole(
        out,
        pdu_type::IC_REQ,
        0,
        &bytes_of::<_, IC_BYTES>(&r),
        &[],
        Digests::NONE,
        0,
    )
}

/// Write an ICResp (a controller's side; the tests use it). Returns 128.
pub fn write_ic_resp(
    out: &mut [u8],
    cpda: u8,
    digests: Digests,
    maxh2cdata: u32,
) -> Result<usize, BuildError> {
    if cpda > MAX_PDA {
        return Err(BuildError::BadPda(cpda));
    }
    let r = IcResp {
        ch: CommonHeader::default(),
        pfv: PFV,
        cpda,
        dgst: digests.to_byte(),
        maxh2cdata,
        rsvd: [0; 112],
    };
    write_whole(
        out,
        pdu_type::IC_RESP,
        0,
        &bytes_of::<_, IC_BYTES>(&r),
        &[],
        Digests::NONE,
        0,
    )
}

/// Write a CapsuleCmd with `sqe` and in-capsule `data` (may be empty),
/// aligned to the controller's CPDA.
pub fn write_capsule_cmd(
    out: &mut [u8],
    sqe: &Sqe,
    data: &[u8],
    neg: &Negotiated,
) -> Result<usize, BuildError> {
    let h = CapsuleCmdHeader {
        ch: CommonHeader::default(),
        sqe: *sqe,
    };
    write_whole(
        out,
        pdu_type::CAPSULE_CMD,
        0,
        &bytes_of::<_, CAPSULE_CMD_HLEN>(&h),
        data,
        neg.digests,
        neg.cpda,
    )
}

/// Write only the header part of a CapsuleCmd with `data_len` bytes of
/// in-capsule data: header, digest, padding (`layout.pdo` bytes, or
/// `header_end` without data). The caller sends the data from its own
/// buffer and then [`data_digest_bytes`] if data digests are on.
pub fn write_capsule_cmd_header(
    out: &mut [u8],
    sqe: &Sqe,
    data_len: usize,
    neg: &Negotiated,
) -> Result<PduLayout, BuildError> {
    let layout = PduLayout::new(CAPSULE_CMD_HLEN, data_len, neg.digests, neg.cpda, true)
        .ok_or(BuildError::DataTooLarge(data_len))?;
    let head = if data_len > 0 {
        layout.pdo
    } else {
        layout.header_end
    };
    room(out, head)?;
    let h = CapsuleCmdHeader {
        ch: CommonHeader::default(),
        sqe: *sqe,
    };
    write_plain(&h, out);
    finish_header(out, pdu_type::CAPSULE_CMD, 0, &layout, neg.digests, true);
    Ok(layout)
}

/// Write a CapsuleResp carrying `cqe` (a controller's side).
pub fn write_capsule_resp(
    out: &mut [u8],
    cqe: &Cqe,
    neg: &Negotiated,
) -> Result<usize, BuildError> {
    let h = CapsuleRespHeader {
        ch: CommonHeader::default(),
        cqe: *cqe,
    };
    write_whole(
        out,
        pdu_type::CAPSULE_RESP,
        0,
        &bytes_of::<_, CAPSULE_RESP_HLEN>(&h),
        &[],
        neg.digests,
        0,
    )
}

/// The fields of one H2CData or C2HData PDU.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DataPdu {
    /// [`pdu_type::H2C_DATA`] or [`pdu_type::C2H_DATA`].
    pub pdu_type: u8,
    /// CID of the command.
    pub cccid: u16,
    /// Transfer tag (H2CData: the R2T's).
    pub ttag: u16,
    /// Offset in the command's transfer.
    pub datao: u32,
    /// LAST_PDU.
    pub last: bool,
    /// SUCCESS (C2HData with `last` only).
    pub success: bool,
}

impl DataPdu {
    fn header(&self, datal: usize) -> [u8; DATA_HLEN] {
        let h = DataHeader {
            ch: CommonHeader::default(),
            cccid: self.cccid,
            ttag: self.ttag,
            datao: self.datao,
            datal: datal as u32,
            rsvd: 0,
        };
        bytes_of::<_, DATA_HLEN>(&h)
    }
    fn flag_bits(&self) -> u8 {
        (if self.last { flags::LAST_PDU } else { 0 })
            | (if self.success { flags::SUCCESS } else { 0 })
    }
    fn pda(&self, neg: &Negotiated) -> u8 {
        if self.pdu_type == pdu_type::C2H_DATA {
            neg.hpda
        } else {
            neg.cpda
        }
    }
}

/// Write a whole H2CData/C2HData PDU with `data` (not empty).
pub fn write_data(
    out: &mut [u8],
    pdu: &DataPdu,
    data: &[u8],
    neg: &Negotiated,
) -> Result<usize, BuildError> {
    if data.is_empty() {
        return Err(BuildError::DataTooLarge(0));
    }
    write_whole(
        out,
        pdu.pdu_type,
        pdu.flag_bits(),
        &pdu.header(data.len()),
        data,
        neg.digests,
        pdu.pda(neg),
    )
}

/// Write the header part of an H2CData/C2HData PDU for `data_len` bytes
/// (up to `layout.pdo`); the data and its digest follow from the caller's
/// buffer (a vectored send).
pub fn write_data_header(
    out: &mut [u8],
    pdu: &DataPdu,
    data_len: usize,
    neg: &Negotiated,
) -> Result<PduLayout, BuildError> {
    if data_len == 0 {
        return Err(BuildError::DataTooLarge(0));
    }
    let layout = PduLayout::new(DATA_HLEN, data_len, neg.digests, pdu.pda(neg), true)
        .ok_or(BuildError::DataTooLarge(data_len))?;
    room(out, layout.pdo)?;
    out[..DATA_HLEN].copy_from_slice(&pdu.header(data_len));
    finish_header(
        out,
        pdu.pdu_type,
        pdu.flag_bits(),
        &layout,
        neg.digests,
        true,
    );
    Ok(layout)
}

/// Write an R2T (a controller's side).
pub fn write_r2t(
    out: &mut [u8],
    cccid: u16,
    ttag: u16,
    r2to: u32,
    r2tl: u32,
    neg: &Negotiated,
) -> Result<usize, BuildError> {
    let h = R2tHeader {
        ch: CommonHeader::default(),
        cccid,
        ttag,
        r2to,
        r2tl,
        rsvd: 0,
    };
    write_whole(
        out,
        pdu_type::R2T,
        0,
        &bytes_of::<_, DATA_HLEN>(&h),
        &[],
        neg.digests,
        0,
    )
}

/// Write an H2CTermReq (or, with `pdu_type::C2H_TERM_REQ`, a C2HTermReq)
/// with `fes`/`fei` and up to 128 bytes of the offending PDU header.
pub fn write_term_req(
    out: &mut [u8],
    term_type: u8,
    fes: u16,
    fei: u32,
    offending: &[u8],
) -> Result<usize, BuildError> {
    let copied = offending.len().min(TERM_REQ_MAX_BYTES - DATA_HLEN);
    let plen = DATA_HLEN + copied;
    room(out, plen)?;
    let h = TermReqHeader {
        ch: CommonHeader {
            pdu_type: term_type,
            flags: 0,
            hlen: DATA_HLEN as u8,
            pdo: 0,
            plen: plen as u32,
        },
        fes,
        fei: fei.to_le_bytes(),
        rsvd: [0; 10],
    };
    write_plain(&h, out);
    out[DATA_HLEN..plen].copy_from_slice(&offending[..copied]);
    Ok(plen)
}
