//! # NVMe over TCP: the PDU layer and the Fabrics command set
//!
//! Plain data and codecs, no sockets: what an NVMe/TCP queue pair (a future
//! `Wire` beside [`super::pcie`]) stands on.
//!
//! - [`pdu`]: the `#[repr(C)]` wire structs (common header, ICReq/ICResp,
//!   CapsuleCmd/CapsuleResp, H2CData/C2HData, R2T, TermReq), an in-place
//!   parser that accepts a PDU split across any number of receives
//!   ([`pdu::Parse::Incomplete`]) and checks every length and offset
//!   before it reads ([`pdu::parse_header`] checks a header before its
//!   data has arrived), and builders that write into a caller's buffer.
//! - [`digest`]: CRC32C header and data digests (whole, or piece by piece
//!   for data placed straight into a command's buffer).
//! - [`recv`]: [`recv::RecvBuf`], a connection's fixed receive buffer:
//!   receive into it, parse in place, consume.
//! - [`fabrics`]: opcode 0x7F (Connect and its 1024-byte data, Property
//!   Get/Set, Disconnect), Keep Alive, the SGL descriptors NVMe/TCP uses
//!   (Transport Data Block for R2T/C2H transfers, Data Block with an offset
//!   for in-capsule data), and the Fabrics fields of Identify Controller.
//!
//! Errors ([`pdu::PduError`], [`pdu::BuildError`]) are `Copy` values that
//! name the field at fault, so a connection can end with a typed error and
//! answer the peer with the matching TermReq FES ([`pdu::PduError::fes`]).
//!
//! The parser never panics and never slices outside the buffer it is
//! given: the property tests in [`pdu`] feed it arbitrary bytes and every
//! split of valid PDUs.

pub mod digest;
pub mod fabrics;
pub mod pdu;
pub mod recv;

#[cfg(test)]
mod tests;

pub use digest::{DataDigest, Digests};
pub use pdu::{BuildError, Direction, Negotiated, Parse, Pdu, PduError};
pub use recv::RecvBuf;
