//! The builders: PDUs written into a caller's buffer, no allocation.

use super::error::BuildError;
use super::header::{
    flags, pdu_type, write_plain, CapsuleCmdHeader, CapsuleRespHeader, CommonHeader, DataHeader,
    IcReq, IcResp, Negotiated, PduLayout, R2tHeader, TermReqHeader, CAPSULE_CMD_HLEN,
    CAPSULE_RESP_HLEN, COMMON_HEADER_BYTES, DATA_HLEN, IC_BYTES, MAX_PDA, PFV, TERM_REQ_MAX_BYTES,
};
use super::parser::has_header_digest;
use crate::nvme::spec::{Cqe, Sqe};
use crate::nvme::tcp::digest::{crc32c, Digests, DIGEST_BYTES};
use mcqio_vfio::PlainData;

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
