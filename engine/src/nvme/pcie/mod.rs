//! # NVMe over PCIe
//!
//! What only the PCIe transport of NVMe has: controller registers in BAR0
//! (CC/CSTS), rings in host memory with doorbells, and the Create/Delete
//! I/O queue admin commands that hand those rings to the controller. Its
//! controller is [`super::ctrl`] and its admin queue [`super::admin`]
//! (both PCIe's today, outside this folder); the wire formats
//! ([`super::spec`]) are what NVMe over TCP reuses.
//!
//! - `bringup`: [`Controller::new`](super::Controller::new) (the sequence
//!   in [`super::ctrl`]), the disable and re-initialisation of a reset, the
//!   CC.SHN shutdown when the controller is dropped.
//! - `enable`: CSTS reads and waits, the CC configuration, disabling, the
//!   checks that doorbells lie inside BAR0.
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

pub(super) mod bringup;
pub(super) mod enable;
pub(super) mod ioq;
pub(super) mod irq;
pub mod qpair;
pub mod queue;
pub(super) mod shadow;
