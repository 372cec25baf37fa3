//! The in-place parser: a PDU's header checked as soon as it is there, the
//! whole PDU (digests included) once it is.

use super::error::PduError;
use super::header::pda_alignment;
use super::header::{
    flags, pdu_type, read_plain, CapsuleCmdHeader, CapsuleRespHeader, CommonHeader, DataHeader,
    Direction, IcReq, IcResp, Negotiated, PduLayout, R2tHeader, TermReqHeader, CAPSULE_CMD_HLEN,
    CAPSULE_RESP_HLEN, COMMON_HEADER_BYTES, DATA_HLEN, IC_BYTES, MAX_PDA, MIN_MAXH2CDATA, PFV,
    TERM_REQ_MAX_BYTES,
};
use crate::nvme::spec::{Cqe, Sqe};
use crate::nvme::tcp::digest::{crc32c, DIGEST_BYTES};

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
        /// Fatal error status ([`fes`](crate::nvme::tcp::pdu::fes)).
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

pub(super) const fn sent_by(pdu_type: u8) -> Direction {
    match pdu_type {
        pdu_type::IC_REQ | pdu_type::H2C_TERM_REQ | pdu_type::CAPSULE_CMD | pdu_type::H2C_DATA => {
            Direction::HostToController
        }
        _ => Direction::ControllerToHost,
    }
}

/// Whether the type carries a header digest when one is negotiated.
pub(super) const fn has_header_digest(pdu_type: u8) -> bool {
    !matches!(
        pdu_type,
        pdu_type::IC_REQ | pdu_type::IC_RESP | pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ
    )
}

/// Whether the type may carry data (and so a data digest).
pub(super) const fn may_carry_data(pdu_type: u8) -> bool {
    matches!(
        pdu_type,
        pdu_type::CAPSULE_CMD | pdu_type::H2C_DATA | pdu_type::C2H_DATA
    )
}

#[inline]
pub(super) fn le32(b: &[u8], at: usize) -> u32 {
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
/// checked with [`crate::nvme::tcp::digest::DataDigest`]).
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

pub(super) fn check_ic(pfv: u16, pda: u8) -> Result<(), PduError> {
    if pfv != PFV {
        return Err(PduError::UnsupportedPfv(pfv));
    }
    if pda > MAX_PDA {
        return Err(PduError::BadPda(pda));
    }
    Ok(())
}
