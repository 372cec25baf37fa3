//! # NVMe over TCP: the initiator
//!
//! A third wire on the shared queue-pair engine, beside [`super::pcie`]:
//!
//! - [`TcpController`] ([`controller`]): the association — the admin queue
//!   on its own connection, Fabrics bring-up (Connect, Property Get/Set in
//!   place of MMIO), Identify, Number of Queues, Keep Alive from polling
//!   (sent from one poll, its answer taken on a later one).
//! - [`TcpQueuePair`] ([`qpair`]): one I/O queue per connection, owned by
//!   one thread; it embeds `core::qpair::Engine` and implements its
//!   `Wire` and `Addressed`, so it is a [`crate::core::block::BlockQueue`]
//!   with the blocking helpers, like the PCIe and UFS queue pairs.
//! - [`TcpError`] ([`error`]): how a connection ends, inside
//!   [`crate::Error::Transport`].
//! - [`discover`] ([`discovery`]): the subsystems a port offers, from its
//!   discovery controller's Discovery Log Page.
//!
//! Under them, plain data and codecs, no sockets:
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
//! - `r2t`: the H2CData a queue pair owes for R2Ts, a FIFO answered in
//!   order as its send queue has room.
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

mod conn;
pub mod controller;
pub mod digest;
pub mod discovery;
pub mod error;
pub mod fabrics;
mod link;
mod memory;
mod pace;
pub mod pdu;
pub mod qpair;
mod r2t;
mod ready;
pub mod recv;

#[cfg(test)]
mod tests;

pub use controller::{TcpController, TcpOptions};
pub use digest::{DataDigest, Digests};
pub use discovery::{discover, DiscoveryEntry, DiscoveryLog, DISCOVERY_NQN};
pub use error::{TcpError, Violation};
pub use pdu::{BuildError, Direction, Negotiated, Parse, Pdu, PduError};
pub use qpair::{TcpQpairStats, TcpQueuePair};
pub use recv::RecvBuf;
