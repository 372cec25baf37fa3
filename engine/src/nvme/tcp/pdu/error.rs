//! What can be wrong with a PDU received or built.

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
