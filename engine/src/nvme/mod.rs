//! # NVMe transport
//!
//! The NVMe wire and its controller, over the shared [`crate::core`]:
//!
//! - [`spec`]: wire formats (registers, SQE/CQE, command builders, identify, status).
//! - [`ctrl`]: [`Controller`], the NVMe over PCIe controller: options,
//!   namespaces, the state word, admin entry points, reset, queue ids.
//! - [`admin`]: the admin queue: commands, Asynchronous Event Requests
//!   ([`AsyncEvent`]), Identify, [`Controller::admin_read`].
//! - [`pcie`]: NVMe over PCIe: [`QueuePair`] (PRP lists, transfers split
//!   at MDTS) in [`pcie::qpair`], on the rings and doorbells of
//!   [`pcie::queue`].
//! - [`tcp`]: NVMe over TCP: [`tcp::TcpController`] and
//!   [`tcp::TcpQueuePair`] on the same queue-pair engine, reusing [`spec`],
//!   the namespace checks of [`ctrl`] and the namespace-list walk of
//!   [`admin`].

pub mod admin;
pub mod ctrl;
mod mapped;
pub mod pcie;
mod per_core;
pub mod spec;
pub mod tcp;

pub use crate::core::timeout::Outstanding;
pub use ctrl::{AsyncEvent, Controller, ControllerOptions, Namespace};
pub use mapped::MappedQueuePair;
pub use pcie::qpair::{QpairOptions, QpairStats, QueuePair};

pub use spec::NvmeStatus;
