//! # NVMe
//!
//! NVMe over its wires, over the shared [`crate::core`]:
//!
//! - [`spec`]: wire formats (registers, SQE/CQE, command builders, identify, status).
//! - [`host`]: the NVMe layer every wire shares — [`NvmeController`]
//!   (identify, namespaces, the state word, queue ids, the enable/disable
//!   /shutdown handshakes) over a [`Link`], one [`QpairOptions`], the NVM
//!   command semantics and Abort-on-timeout of every queue pair.
//! - [`pcie`]: NVMe over PCIe: [`Controller`] (`NvmeController<PcieLink>`:
//!   the BAR, the admin rings, shadow doorbells, MSI-X) and [`QueuePair`]
//!   (PRP lists, transfers split at MDTS) on the rings and doorbells of
//!   [`pcie::queue`].
//! - [`tcp`]: NVMe over TCP: [`tcp::TcpController`]
//!   (`NvmeController<TcpLink>`: the association's admin connection,
//!   Property Get/Set, Keep Alive) and [`tcp::TcpQueuePair`].
//!
//! `pcie/` and `tcp/` implement [`Link`] and their queue mechanics and
//! never name each other; both reach the layer under them through
//! [`host`] (`.ci/import-cycles` checks it).
//!
//! # Where new things go
//!
//! - **A fourth NVMe wire** (NVMe over RDMA, vfio-user) is a folder beside
//!   `pcie/` and `tcp/`: a link struct implementing [`Link`] (its admin
//!   queue as `host::identify::Exchange`, its registers as
//!   `host::regs::Registers`, its reset and failure), a constructor that
//!   runs `host`'s bring-up steps, and a queue pair folder with the same
//!   files as the others (`create`, `submit`, `reap`, `wire`, `timeouts`,
//!   `teardown`, `blocking`) implementing `core::qpair::Wire`. It touches
//!   neither `core/` nor the other wires.
//! - **An NVMe feature** (zoned namespaces, metadata/PI, passthrough) is
//!   its command builders in [`spec`], its identify data and namespace
//!   checks in [`host`] (written once), and on each wire only what the
//!   wire must carry differently (PCIe's PRP/SGL and metadata pointer,
//!   TCP's in-capsule or R2T data).

pub mod host;
mod mapped;
pub mod pcie;
pub mod spec;
pub mod tcp;

pub use crate::core::timeout::Outstanding;
pub use host::{Link, Namespace, NvmeController, QpairOptions, MAX_NAMESPACES};
pub use mapped::MappedQueuePair;
pub use pcie::admin::{event_type, AsyncEvent, MAX_ADMIN_READ};
pub use pcie::controller::{Controller, ControllerOptions, PcieLink, TimeoutPolicy};
pub use pcie::qpair::{QpairStats, QueuePair};
pub use tcp::controller::TcpLink;

pub use spec::NvmeStatus;
