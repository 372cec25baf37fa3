//! # NVMe over PCIe
//!
//! What only the PCIe transport of NVMe has: controller registers in BAR0
//! (CC/CSTS), rings in host memory with doorbells, and the Create/Delete
//! I/O queue admin commands that hand those rings to the controller. The
//! generic controller ([`super::ctrl`]), the admin command set
//! and the wire formats ([`super::spec`]) are what another
//! NVMe transport (NVMe/TCP) would reuse.
//!
//! - [`queue`]: [`QueuePair`](queue::QueuePair): SQ/CQ rings, doorbells,
//!   PRP lists, transfers split at MDTS.

pub(super) mod bringup;
pub(super) mod enable;
pub(super) mod ioq;
pub mod queue;
pub(super) mod shadow;
