//! NVMe wire formats: registers, submission and completion queue entries,
//! command builders, identify pages and status codes.
//!
//! Everything here is plain data with no device access, so it is unit- and
//! property-testable without a controller. The driver assumes a
//! little-endian host (NVMe structures are little-endian); a big-endian build
//! fails at compile time rather than silently byte-swapping wrong.

#[cfg(target_endian = "big")]
compile_error!(
    "mcqio writes NVMe structures in host byte order and supports little-endian hosts only"
);

pub mod cqe;
pub mod identify;
pub mod opcodes;
pub mod regs;
pub mod sqe;
pub mod status;

pub use cqe::Cqe;
pub use identify::{IdentifyController, IdentifyNamespace, LbaFormat};
pub use sqe::Sqe;
pub use status::NvmeStatus;
