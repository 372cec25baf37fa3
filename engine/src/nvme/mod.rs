//! # NVMe transport
//!
//! The NVMe wire and its controller, over the shared [`crate::core`]:
//!
//! - [`spec`]: wire formats (registers, SQE/CQE, command builders, identify, status).
//! - [`ctrl`]: [`Controller`] bring-up, admin queue, reset, shutdown.
//! - [`queue`]: [`QueuePair`]: rings, doorbells, PRP lists, transfers split at MDTS.

pub mod ctrl;
mod mapped;
mod per_core;
pub mod queue;
pub mod spec;

pub use ctrl::{AsyncEvent, Controller, ControllerOptions, Namespace};
pub use mapped::MappedQueuePair;
pub use queue::{Outstanding, QpairOptions, QpairStats, QueuePair};
pub use spec::NvmeStatus;
