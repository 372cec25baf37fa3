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

mod builders;
mod error;
mod header;
mod parser;

pub use self::builders::*;
pub use self::error::*;
pub use self::header::*;
pub use self::parser::*;
