//! # UFS transport (UFSHCI 4.0)
//!
//! The UFS host-controller interface (UFSHCI 4.0, JESD223E) and the UFS
//! protocol units (UPIU) and SCSI command set it carries, as a sibling of
//! the NVMe transport with the same application-facing shape:
//!
//! ```text
//! UfsController::new(backend, UfsOptions::default())   // HCE, link, device init, MCQ or legacy
//!   └─ ctrl.create_qpair()                              // one per thread: an MCQ SQ/CQ pair, or the legacy list
//!        ├─ qp.read(lun, lba, blocks, buf, tag)         // UTRD + UCD (COMMAND UPIU, PRDT), no doorbell yet
//!        ├─ qp.submit()                                 // one SQTP (or UTRLDBR) store per batch
//!        └─ qp.poll(max, |c: Completion<_>| ..)         // one CQTP (or UTRLDBR) read, one CQHP store
//! ```
//!
//! Against the fake controller of `mcqio-fixtures` (a real device is the
//! same behind `mcqio_vfio::VfioBackend`):
//!
//! ```
//! use std::sync::Arc;
//! use mcqio::ufs::{UfsController, UfsMode, UfsOptions};
//! use mcqio::vfio::{Backend, DmaDir};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = mcqio_fixtures::ufs::UfsConfig {
//!     exec: mcqio_fixtures::ExecMode::Sync,
//!     ..Default::default()
//! };
//! let backend: Arc<dyn Backend> = mcqio_fixtures::ufs::FakeUfs::new(cfg)?;
//! let ctrl = UfsController::new(backend, UfsOptions { queues: 2, ..Default::default() })?;
//! assert_eq!(ctrl.mode(), UfsMode::Mcq { queues: 2 });
//! let mut qp = ctrl.create_qpair()?;
//!
//! let mut buf = ctrl.alloc_buf(8192, DmaDir::Bidirectional)?;
//! buf.fill(0x5a);
//! qp.write(0, 16, 2, buf, 7).map_err(|e| e.kind)?; // LU 0, 2 blocks of 4 KiB at LBA 16
//! qp.submit();                                     // one SQTP store for the batch
//! let mut done = None;
//! while done.is_none() {
//!     qp.poll(32, |c| done = Some(c))?;            // one CQTP read per poll
//! }
//! let c = done.unwrap();
//! assert_eq!(c.tag, 7);
//! c.result?;
//!
//! let mut back = vec![0u8; 8192];
//! qp.read_blocking(0, 16, &mut back)?;
//! assert!(back.iter().all(|&b| b == 0x5a));
//! # Ok(())
//! # }
//! ```
//!
//! A command completes exactly once with its buffer; a transport error
//! (OCS) or a SCSI error (CHECK CONDITION with sense) arrives as
//! [`crate::IoError::Ufs`]. A completion that names no command in flight
//! (a stale or duplicate entry, a UCD address that is not ours) is counted
//! in [`UfsQpairStats::stale_completions`] and dropped. A fatal controller
//! (IS) is disabled, a removed one noticed (all ones); every outstanding
//! command then completes with [`crate::IoError::ControllerFailed`].
//!
//! The transport, file by file:
//!
//! - [`ctrl`]: [`UfsController`] bring-up (HCE, DME_LINKSTARTUP, NOP,
//!   fDeviceInit, descriptors, REPORT LUNS, UNIT ATTENTION, READ
//!   CAPACITY), the choice of MCQ or legacy, queue configuration with the
//!   DAO offsets read back and bounds-checked.
//! - [`error`]: [`UfsCtrlError`], the control path's typed errors.
//! - `mcq.rs`: one MCQ SQ/CQ pair: byte-offset heads and tails, CQTP polling
//!   (no phase bit), batched SQTP / CQHP stores.
//! - `sdb.rs`: the legacy list: 32 UTRD slots, UTRLDBR bitmap, UTRLCNR.
//! - `ucd.rs`: each queue pair's own slice of command descriptors: COMMAND
//!   UPIU, PRDT from the buffer's segments, RESPONSE decoding.
//! - [`qpair`]: [`UfsQueuePair`], the per-thread I/O object (read, write,
//!   flush, unmap, submit, poll, close, blocking helpers).
//! - `reset.rs`: what a queue pair does at its next poll after
//!   [`UfsController::reset`] (host controller reset, the last resort of
//!   recovery) or a controller failure: deliver what completed, end the
//!   rest once with [`crate::IoError::AbortedByReset`] and its buffer,
//!   re-create its hardware queue.
//! - [`hpb`]: Host Performance Booster: the host's copy of the device's L2P
//!   map per LU, shared lock-free by the queue pairs, its policy (both
//!   control modes) and the queue pairs' internal map loads.
//!
//! What is not UFS-specific comes from the shared [`crate::core`], as for
//! NVMe: tag tracking with generations, the split parent table, the timeout
//! policy and scan ([`crate::TimeoutPolicy`]), ending every outstanding
//! command once, the blocking helpers and the [`crate::core::block::BlockQueue`]
//! trait, [`crate::run_per_core`], the strict and lazy mapping modes
//! ([`UfsController::create_mapped_qpair`]), and the I/O types
//! ([`crate::IoBuf`], [`crate::Completion`], [`crate::SubmitError`]).
//!
//! The wire formats, each in the file named after the spec's own noun:
//!
//! - [`spec::regs`]: host-controller registers, MCQ capability and per-queue
//!   configuration / operational registers, UIC commands.
//! - [`spec::utrd`]: UTP Transfer Request Descriptor (the SQ entry), MCQ
//!   completion entry, UTP command descriptor layout, PRDT entry, OCS.
//! - [`spec::upiu`]: UPIU header, COMMAND / RESPONSE, NOP OUT / IN,
//!   QUERY REQUEST / RESPONSE.
//! - [`spec::scsi`]: CDBs (READ/WRITE(10)/(16), SYNCHRONIZE CACHE(10), UNMAP,
//!   TEST UNIT READY, INQUIRY, READ CAPACITY(16), REQUEST SENSE, REPORT
//!   LUNS), SCSI status and fixed-format sense data.
//! - [`spec::desc`]: device, geometry and unit descriptors.
//! - [`spec::status`]: one typed error for a finished command, keeping the
//!   transport status (OCS) and the SCSI status apart.
//!
//! Byte order: UFSHCI structures in host memory (UTRD, CQE, PRDT) and
//! registers are little-endian; everything inside a UPIU, a CDB or a
//! descriptor is big-endian.

pub mod ctrl;
pub mod error;
pub mod hpb;
mod mcq;
mod per_core;
pub mod qpair;
mod sdb;
pub mod spec;
mod ucd;

pub use ctrl::{LogicalUnit, UfsController, UfsMode, UfsOptions};
pub use error::{UfsCtrlError, UfsResult};
pub use hpb::{HpbConfig, HpbControl, HpbMode, HpbStats};
pub use qpair::{UfsQpairOptions, UfsQpairStats, UfsQueuePair};
pub use spec::status::UfsError;
pub use ucd::MAX_PRDT_ENTRIES;
