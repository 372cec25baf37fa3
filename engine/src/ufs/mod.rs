//! # UFS transport (UFSHCI 4.0)
//!
//! The UFS host-controller interface (UFSHCI 4.0, JESD223E) and the UFS
//! protocol units (UPIU) and SCSI command set it carries, as a sibling of
//! the NVMe transport with the same application-facing shape:
//!
//! ```text
//! UfsController::new(backend, UfsOptions::default())   // HCE, link, device init, MCQ or legacy
//!   └─ ctrl.create_qpair(UfsQpairOptions::default())  // one per thread: an MCQ SQ/CQ pair, or the legacy list
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
//! let mut qp = ctrl.create_qpair(Default::default())?;
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
//! # How every UFS command ends
//!
//! The promises are NVMe's (see the crate docs, "How every command ends"),
//! kept with UFS's own means; where UFS cannot keep one, the exception
//! stands next to it.
//!
//! | result | when | buffer |
//! |---|---|---|
//! | `Ok(())` | the controller completed it (OCS SUCCESS) with a GOOD response that moved the whole transfer | back |
//! | [`crate::IoError::Ufs`] | a transport error (OCS), a SCSI status with its sense data (CHECK CONDITION, BUSY, ...), or a response the command's own completion proved but that is malformed or short | back |
//! | [`crate::IoError::TimedOut`] | it exceeded `io_timeout` and the controller confirmed the withdrawal (MCQ: SQ stop and cleanup by nexus; legacy: UTRLCLR) | back |
//! | [`crate::IoError::AbortedByReset`] | [`UfsController::reset`] (host controller reset: HCE = 0, the last resort of recovery) while it was outstanding | back |
//! | [`crate::IoError::Aborted`] | [`UfsQueuePair::close`] withdrew it first | back, or leaked (`None`) if the controller refused the withdrawal |
//! | [`crate::IoError::ControllerFailed`] | a fatal controller (IS: UIC error, link lost, device, UTP, host controller or system bus fatal error) or a removed one (registers read all ones) | back, or leaked (`None`) if the controller cannot be disabled |
//!
//! A buffer that comes back `None` is never unmapped or reused, and neither
//! are the queue's descriptors and rings: [`UfsController::leaked_bytes`]
//! counts them. A failed bring-up and dropping the controller disable it
//! (HCE reads 0) before its memory is freed, and leak that memory when it
//! does not.
//!
//! ## What a UFS completion can and cannot prove
//!
//! An MCQ completion entry names no tag, only the command descriptor (UCD)
//! address the UTRD pointed at, which a controller must echo exactly (a
//! host finds its command from it). So each slot owns 16 UCD places,
//! 128 bytes apart, and each new command in the slot takes the next one:
//! an entry proves its command when its address is the current UCD of a
//! busy slot, whatever its OCS, before anything is delivered — in the poll
//! and in what a queue pair delivers after a reset. Anything else (an
//! earlier command's entry re-posted or duplicated, an address outside
//! every slot, misaligned, of another queue, of the queue's previous
//! owner) is counted in [`UfsQpairStats::stale_completions`] and delivers
//! nothing. Consumed entries are cleared, so a re-read ring lap proves
//! nothing either. **Exception:** a stale entry of a slot that was reused
//! exactly a multiple of 16 times since carries the current address and is
//! taken for the current command — the same bound NVMe's CIDs have at
//! their deepest queues (crate docs, "What a completion's CID can and cannot prove").
//!
//! The legacy single doorbell has no completion entries: a command is done
//! when the doorbell bit mcqio set reads 0, which happens once per ring,
//! so it has no stale or duplicate completions to prove. It cannot prove
//! more than the spec's ordering: that the OCS and response were written
//! before the bit cleared, or anything about a controller that clears bits
//! it did not complete (an OCS still at its 0xF pre-fill ends as that
//! transport error).
//!
//! A proven SUCCESS still needs a RESPONSE UPIU for this command's task
//! tag with GOOD status and a whole transfer (no OVERFLOW or UNDERFLOW
//! flag, residual 0); otherwise it ends as that command's own error with
//! its buffer ([`UfsError::Underflow`], [`UfsError::Overflow`],
//! [`UfsError::BadResidual`] for a transfer that was not whole; a device
//! that moves less and reports neither cannot be caught). Task tags are unique across every queue pair of a
//! controller: bring-up bounds the depth to 256 / (MCQ queues), and the
//! granted depth is [`UfsController::depth`].
//!
//! ## What the controller reports is checked
//!
//! Queue register blocks outside the BAR, unaligned or overlapping any
//! other block, capacities that overflow, LU lists and descriptors out of
//! range are typed errors at bring-up ([`UfsCtrlError`]), never a crash. An
//! LU whose block the transfer limit cannot carry is listed with
//! [`LogicalUnit::usable`] `false` and refuses reads and writes with a
//! typed error, instead of failing the controller. Bring-up and reset send
//! a device command that fails transiently again (a transport error, a
//! timed-out request the controller gave back, BUSY, TASK SET FULL, a
//! CHECK CONDITION other than ILLEGAL REQUEST / medium not present, a
//! query GENERAL FAILURE): up to 3 attempts, plus up to 10 UNIT
//! ATTENTIONs; a device that keeps failing ends in its typed error.
//! `mcqio_fixtures::ufs::HostileUfs` lies in all of these in the tests.
//!
//! HPB keeps the same promises with its own exceptions ([`hpb`], "On the
//! I/O path"): a read submitted after a write completed never carries a
//! map entry older than that write, and the queue pair's internal commands
//! (map loads) never reach the application, its statistics or its timeout
//! policy.
//!
//! The transport, file by file:
//!
//! - [`ctrl`]: [`UfsController`]: options, the state word, the logical
//!   units, accessors, the queue pool and ids, leak accounting, the reset
//!   entry point.
//!   - `ctrl/bringup.rs`: bring-up (HCE, DME_LINKSTARTUP, fDeviceInit,
//!     descriptors, REPORT LUNS, UNIT ATTENTION, READ CAPACITY), the choice
//!     of MCQ or legacy, and the way down (disable, abandon, `Drop`).
//!   - `ctrl/devcmd.rs`: the device-command channel of bring-up and reset
//!     (NOP OUT / IN, QUERY, SCSI commands over slot 0 of the legacy list)
//!     and its one retry rule (`transient`, `DevCmd::retried`).
//! - [`error`]: [`UfsCtrlError`], the control path's typed errors.
//! - `mcq/mod.rs`: one MCQ SQ/CQ pair: byte-offset heads and tails, CQTP
//!   polling (no phase bit), batched SQTP / CQHP stores.
//!   - `mcq/config.rs`: MCQ queue configuration at bring-up and after a
//!     reset: rings programmed, the DAO/ISAO offsets read back and
//!     bounds-checked, MCQ mode selected.
//! - `sdb.rs`: the legacy list: 32 UTRD slots, UTRLDBR bitmap, UTRLCNR.
//! - `ucd.rs`: each queue pair's own slice of command descriptors: COMMAND
//!   UPIU, PRDT from the buffer's segments, RESPONSE decoding.
//! - [`qpair`]: [`UfsQueuePair`], the per-thread I/O object: its options,
//!   statistics, creation from the controller's pool, accessors, and the
//!   decoding shared by the poll and the recovery (`failed_result`,
//!   `end_internal`).
//!   - `qpair/submit.rs`: read, write, flush, unmap: request checks, slot
//!     allocation, UTRD and UCD building, splits, one doorbell per batch.
//!   - `qpair/reap.rs`: the poll: proof of completion, decoding, delivery;
//!     the HPB pass (calls into [`hpb`]).
//!   - `qpair/recover.rs`: timeouts (the shared scan, the controller-reset
//!     hook), withdrawal (MCQ cleanup by nexus, UTRLCLR), `check_timeouts`,
//!     `check_health`, `abort`.
//!   - `qpair/reset.rs`: what a queue pair does at its next poll after
//!     [`UfsController::reset`] (host controller reset, the last resort of
//!     recovery) or a controller failure: deliver what completed, end the
//!     rest once with [`crate::IoError::AbortedByReset`] and its buffer,
//!     re-create its hardware queue.
//!   - `qpair/teardown.rs`: `end_all`, `close`, `Drop` (and the leak when
//!     the controller may still hold the queue's memory).
//!   - `qpair/blocking.rs`: the blocking helpers and the
//!     [`crate::core::block::BlockQueue`] implementation.
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
