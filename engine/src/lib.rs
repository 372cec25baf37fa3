//! # mcqio: a user-space polled NVMe and UFS engine
//!
//! mcqio drives an NVMe controller or a UFS host controller (UFSHCI 4.0,
//! MCQ or the legacy single doorbell) from user space through the
//! [`mcqio_vfio::Backend`] seam (VFIO for real devices, the fake controllers
//! of `mcqio-fixtures` in tests). It is passive: it spawns no threads, takes
//! no locks and makes no system calls on the I/O path (NVMe over TCP,
//! [`nvme::tcp`], is the exception a socket forces: one `sendmsg` per
//! submit batch, one `recv` per poll). The application owns
//! one queue pair per thread ([`QueuePair`] on NVMe over PCIe,
//! [`nvme::tcp::TcpQueuePair`] on NVMe over TCP, [`UfsQueuePair`] on UFS;
//! each implements [`BlockQueue`](core::block::BlockQueue)) and polls it.
//! The rules below are the same on every wire; where a name is NVMe's (an
//! Abort command, CSTS), UFS does the same with its own means
//! (MCQ cleanup or UTRLCLR, the host controller reset
//! [`UfsController::reset`], HCS/IS).
//!
//! ```text
//! Controller::new(backend, ControllerOptions::default())   // bring-up, identify
//!   └─ ctrl.create_qpair(QpairOptions::default())          // one per thread (Send + !Sync)
//!        ├─ qp.read(nsid, slba, nlb, buf, tag)             // SQE into the ring, no doorbell yet
//!        ├─ qp.submit()                                    // one SQ-tail doorbell per batch
//!        └─ qp.poll(max, |c: Completion<_>| ..)            // phase-bit polling, buffer handed back
//! ```
//!
//! A complete program against the fake controller of `mcqio-fixtures` (a
//! real device is the same with `mcqio_vfio::VfioBackend::open("0000:00:03.0")`):
//!
//! ```
//! use std::sync::Arc;
//! use mcqio::{Controller, ControllerOptions, QpairOptions, vfio::{Backend, DmaDir}};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let fake = mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync())?;
//! let backend: Arc<dyn Backend> = fake;
//! let ctrl = Controller::new(backend, ControllerOptions::default())?;
//! let mut qp = ctrl.create_qpair(QpairOptions::default())?;
//!
//! // Asynchronous: the buffer moves into the queue and comes back in the completion.
//! let mut buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional)?;
//! buf.fill(0x5a);
//! qp.write(1, 0, 8, buf, 7).map_err(|e| e.kind)?; // 8 blocks of 512 B at LBA 0, tag 7
//! qp.submit();                                    // one doorbell for the batch
//! let mut done = None;
//! while done.is_none() {
//!     qp.poll(32, |c| done = Some(c))?;
//! }
//! let c = done.unwrap();
//! assert_eq!(c.tag, 7);
//! c.result?;
//!
//! // Blocking convenience API over the same queue pair.
//! let mut back = vec![0u8; 4096];
//! qp.read_blocking(1, 0, &mut back)?;
//! assert!(back.iter().all(|&b| b == 0x5a));
//! # Ok(())
//! # }
//! ```
//!
//! # How every command ends
//!
//! A submitted command completes exactly once, as a [`Completion`] from
//! [`QueuePair::poll`] or from [`QueuePair::close`]; its buffer comes back
//! in that completion once the device can no longer access it. The result:
//!
//! | result | when | buffer |
//! |---|---|---|
//! | `Ok(())` | the controller completed it successfully | back |
//! | [`IoError::Nvme`] | the controller completed it with an error status | back |
//! | [`IoError::TimedOut`] | it exceeded [`QpairOptions::io_timeout`] (counted from its submission; a command whose completion is already posted in the CQ never times out) and the controller confirmed the Abort mcqio sent ([`TimeoutPolicy::Abort`]) | back |
//! | [`IoError::AbortedByReset`] | the controller was reset while it was outstanding ([`Controller::reset`], or a timeout policy); it may or may not have executed | back |
//! | [`IoError::Aborted`] | [`QueuePair::close`] deleted the queue before the controller completed it | back, or leaked (`None`) if deleting the queue failed: the controller still owns it |
//! | [`IoError::ControllerFailed`] | CSTS.CFS or surprise removal; `poll` returns [`Error::ControllerFatal`] / [`Error::DeviceGone`] | back, or leaked (`None`) if a fatal controller could not even be disabled |
//! | [`IoError::ConnectionLost`] | NVMe/TCP: the queue pair's connection ended (closed, TermReq, a malformed or hostile PDU); `poll` returns [`Error::Transport`] with the [`nvme::tcp::TcpError`] | back (a socket reaches no memory once unused) |
//!
//! Whenever a buffer is leaked, so are the queue's rings and PRP list pages
//! (when the queue pair is dropped): memory the device may still access is
//! never unmapped or reused. [`Controller::leaked_bytes`] counts it.
//! A panic in the callback of `poll` or `close` loses no completion count
//! and skips no clean-up (dropping the queue pair finishes a `close`).
//!
//! A read or write above the per-command limit (MDTS) is split into child
//! commands and still completes once: with the first error any child
//! reported, or the error that ended the children still in flight (reset,
//! close), and its buffer after every child finished.
//!
//! A rejected submission never started and hands its buffer back in a
//! [`SubmitError`]. A CQE that matches no command in flight (duplicate,
//! stale, corrupt CID) is counted in [`QpairStats::stale_completions`] and
//! dropped.
//!
//! ## What a completion's CID can and cannot prove
//!
//! A CID is `slot | generation` (see `core::tracker`). mcqio detects and drops a
//! CQE whose CID names a free slot, a busy slot with another generation (a
//! late or duplicated completion of an earlier command in that slot, or a
//! bit flip in the generation bits), or another submission queue (SQ ID
//! field). It **cannot** detect a CQE that carries the exact CID of
//! another command in flight on the same queue (a device that completes
//! command B under command A's CID, or a flip in the slot bits that lands
//! on a busy slot of the current generation): nothing in the CQE tells
//! that apart from A's own completion, so A completes with B's status and
//! its buffer is handed back while the device may still be working on A.
//! A's real completion then arrives as stale, and B never completes
//! (its timeout policy applies). No host driver can tell these apart
//! without end-to-end data protection. The fake of `mcqio-fixtures`
//! produces both kinds: `Fault::CidXor` (a chosen bit flip) and
//! `Fault::StealCid` (the CID of another outstanding command).
//!
//! ## Timeouts, reset, failure
//!
//! All detected while polling — mcqio has no timer thread. Each poll reads
//! a coarse clock (already needed for command ages) and one relaxed load of
//! the controller's state word; the timeout scan over outstanding commands
//! runs only when a quarter of the timeout has passed since the last one,
//! and skips commands whose completion is already posted in the CQ. The
//! clock is also read when a command arrives on an idle queue, so an idle
//! gap never ages the next command. Nothing is added per I/O but a
//! one-byte store when a command is armed and one compare (is the queue
//! idle?).
//!
//! - **Timeout** ([`TimeoutPolicy`], per queue pair; the admin queue has
//!   [`ControllerOptions::admin_timeout`] and its own policy):
//!   `ReportOnly` counts it ([`QpairStats::timeouts`]) and leaves the
//!   command alone; `Abort` sends an Abort — if the controller aborts it,
//!   its completion arrives as [`IoError::TimedOut`]; if the Abort is
//!   refused or fails, or the aborted command still does not complete
//!   within another timeout, the controller is reset; `Reset` resets at
//!   once. A timed-out command is never completed while the device might
//!   still DMA into its buffer: only its own completion or a reset (the
//!   controller disabled, CSTS.RDY = 0) ends it.
//! - **Reset** ([`Controller::reset`]): every queue pair, at its next poll,
//!   delivers what the controller completed before the reset, completes the
//!   rest with [`IoError::AbortedByReset`] (spread over as many polls as
//!   their `max` needs), and re-creates its queues on the controller
//!   transparently (same queue id and memory). The application resubmits.
//!   Until then [`QueuePair::submit`] rings no doorbell. Asynchronous Event Requests are re-posted; events keep
//!   arriving through [`Controller::async_events`].
//! - **Controller fatal / surprise removal**: noticed by a poll (CSTS read
//!   while commands are outstanding and nothing completes) or an admin
//!   command. A fatal controller is disabled at once so no DMA stays in
//!   flight; every outstanding command completes with
//!   [`IoError::ControllerFailed`]; later submissions, polls, admin
//!   commands and `close` fail fast with the same error. A fatal controller
//!   can be brought back with [`Controller::reset`]; a removed one cannot.
//!
//! Lower-level hooks remain: [`QueuePair::check_timeouts`] (list old
//! commands), [`QueuePair::abort_command`], [`QueuePair::check_health`].
//!
//! The tree shows the architecture: one core, two command sets (NVMe, UFS),
//! three wires (NVMe over PCIe, NVMe over TCP, UFS).
//!
//! - [`core`]: written once for every wire: tags with generations
//!   (`core::tracker`), the split parent table, the [`TimeoutPolicy`] with
//!   its clock and scan ([`core::timeout`]), ending every outstanding
//!   command exactly once, the I/O API ([`DmaBuf`], the [`IoBuf`] trait,
//!   [`Completion`], typed errors; [`core::io`]), the
//!   [`BlockQueue`](core::block::BlockQueue) trait both queue pairs
//!   implement and the blocking helpers on it ([`core::block`]), application
//!   buffers mapped per I/O ([`MappedQueuePair`], strict and lazy DMA modes;
//!   [`core::mapped`]), one queue pair per core ([`run_per_core`];
//!   [`core::per_core`]).
//! - [`nvme`]: NVMe: wire formats ([`nvme::spec`]); the layer every NVMe
//!   wire shares ([`nvme::host`]: [`nvme::NvmeController`] over a
//!   [`nvme::Link`] — identify, namespaces, the state word, queue ids,
//!   enable/disable/shutdown —, [`QpairOptions`], the NVM command checks
//!   and Abort on timeout); NVMe over PCIe ([`nvme::pcie`]): [`Controller`]
//!   (its bring-up, admin rings, doorbells), [`QueuePair`]
//!   with its PRP lists ([`nvme::pcie::qpair`]) and rings ([`nvme::pcie::queue`]); NVMe over TCP
//!   ([`nvme::tcp`]): [`nvme::tcp::TcpController`] (Fabrics bring-up on
//!   the admin connection) and [`nvme::tcp::TcpQueuePair`] (one connection
//!   per queue pair, on the same queue-pair engine). A socket makes system
//!   calls and copies where a PCIe queue makes none (see that module).
//! - [`ufs`]: the UFS transport (UFSHCI 4.0 MCQ and legacy single doorbell):
//!   wire formats ([`ufs::spec`]: registers, UTRD, UPIU, PRDT, SCSI CDBs),
//!   [`UfsController`] bring-up and host controller reset, [`UfsQueuePair`]
//!   and the recovery after a reset, Host Performance Booster ([`ufs::hpb`]).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod core;
pub mod nvme;
pub mod ufs;

pub use self::core::asyncio::{AsyncQueue, IoFuture, WrapError, WrapErrorKind};
pub use self::core::block::{BlockDevice, BlockUnit};
pub use self::core::error::{Error, Result};
pub use self::core::io::{
    Completion, DmaBuf, DmaSlice, IoBuf, IoError, IoSeg, SubmitError, SubmitErrorKind,
};
pub use self::core::mapped::{MappedSubmitError, MappedSubmitErrorKind, MappingMode};
pub use self::core::per_core::run_per_core;
pub use self::core::qpair::{Interrupt, QueueCounters, SleepOn, WaitPolicy};
pub use self::core::timeout::TimeoutPolicy;
pub use nvme::{
    AsyncEvent, Controller, ControllerOptions, MappedQueuePair, Namespace, NvmeStatus, Outstanding,
    QpairOptions, QpairStats, QueuePair,
};
pub use ufs::{UfsController, UfsCtrlError, UfsError, UfsOptions, UfsQpairOptions, UfsQueuePair};

pub use mcqio_vfio as vfio;

/// The README's Rust blocks, compiled and run by `cargo test --doc` so the
/// usage snippet there cannot rot (issue 16 item 17).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
