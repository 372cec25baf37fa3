//! # NVMe over PCIe
//!
//! What only the PCIe wire of NVMe has: controller registers in BAR0,
//! rings in host memory with doorbells, and the Create/Delete I/O queue
//! admin commands that hand those rings to the controller — under the
//! NVMe layer of [`super::host`], which holds what every wire shares.
//!
//! - [`controller`]: [`PcieLink`](controller::PcieLink), the
//!   [`Link`](super::Link) of [`Controller`](super::Controller)
//!   (`NvmeController<PcieLink>`): the BAR, the admin rings, failure
//!   (a fatal controller is disabled at once); its `bringup`:
//!   [`Controller::new`](super::Controller::new), the disable and
//!   re-initialisation of a reset, the shutdown when it is dropped.
//! - `admin`: the admin rings: commands, Asynchronous Event Requests, the
//!   layer's `Exchange`, `admin_read`.
//! - `bar`: BAR0's registers as the layer's `Registers`, doorbells'
//!   bounds.
//! - `shadow`: shadow doorbells (Doorbell Buffer Config).
//! - `ioq`: Create and Delete I/O SQ/CQ for a queue pair's rings.
//! - `irq`: an MSI-X vector per I/O queue, for queue pairs that wait on
//!   interrupts.
//! - [`queue`]: the SQ/CQ rings and their doorbells.
//! - [`qpair`]: [`QueuePair`](qpair::QueuePair), one folder with the
//!   same file per role as every wire's queue pair: `create`, `submit`
//!   (checks, SQEs, the tail doorbell), `prp` (data pointers), `split`
//!   (transfers above the per-command limit as child commands that
//!   complete once), `reap` (polling the CQ), `wire` (the core's
//!   `Wire` hooks: ring, reap, recovery after a reset or failure),
//!   `timeouts` (the scan's actions, Abort), `teardown` (close, `Drop`),
//!   `wait` (the MSI-X vector), `blocking` (the blocking helpers and
//!   [`BlockQueue`](crate::core::block::BlockQueue)).

pub(super) mod admin;
pub(super) mod bar;
pub mod controller;
pub(super) mod ioq;
pub(super) mod irq;
mod link;
pub mod qpair;
pub mod queue;
pub(super) mod shadow;
