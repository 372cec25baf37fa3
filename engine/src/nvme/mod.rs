//! # NVMe transport
//!
//! The NVMe wire and its controller, over the shared [`crate::core`]:
//!
//! - [`spec`]: wire formats (registers, SQE/CQE, command builders, identify, status).
//! - [`ctrl`]: [`Controller`]: options, namespaces, the state word, admin
//!   entry points, reset, queue ids.
//! - [`admin`]: the admin queue: commands, Asynchronous Event Requests
//!   ([`AsyncEvent`]), Identify, [`Controller::admin_read`].
//! - [`pcie`]: NVMe over PCIe: [`QueuePair`] (rings, doorbells, PRP lists,
//!   transfers split at MDTS) in [`pcie::queue`].
//! - [`tcp`]: NVMe over TCP: [`tcp::TcpController`] and
//!   [`tcp::TcpQueuePair`] on the same queue-pair engine, reusing [`spec`],
//!   the namespace checks of [`ctrl`] and the namespace-list walk of
//!   [`admin`].
//!
//! [`queue`] is [`pcie::queue`] under its former path.

pub mod admin;
pub mod ctrl;
mod mapped;
pub mod pcie;
mod per_core;
pub mod spec;
pub mod tcp;

pub use ctrl::{AsyncEvent, Controller, ControllerOptions, Namespace};
pub use mapped::MappedQueuePair;
pub use pcie::queue;
pub use queue::{Outstanding, QpairOptions, QpairStats, QueuePair};
pub use spec::NvmeStatus;
