//! # mcqio-ublk: any namespace or logical unit mcqio drives, as a kernel block device
//!
//! Linux's ublk driver (`ublk_drv`, 6.12 and later here) exposes
//! `/dev/ublkbN`, whose requests a user-space server answers over
//! io_uring. `mcqio-ublk add <device-string>` is such a server for every
//! device the engine opens (`vfio:<BDF>` NVMe or UFS, `fake`, `fake-ufs`,
//! `tcp:<addr>:<port>/<nqn>` NVMe/TCP targets, one connection per queue),
//! so unmodified programs — `mkfs.ext4`, `mount`, fio's kernel engines,
//! databases — run on the user-space driver.
//!
//! ## Shape
//!
//! - [`sys`]: the ublk ABI as `#[repr(C)]` structs with checked layouts
//!   and ioctl-encoded command numbers;
//! - [`ctrl`]: `/dev/ublk-control` (ADD / SET_PARAMS / START / STOP / DEL
//!   / GET_DEV_INFO / GET_PARAMS / GET_FEATURES);
//! - [`queue`]: the seam [`queue::UblkQueue`] and the kernel queue behind
//!   it (the descriptor array mapped from `/dev/ublkcN`, one io_uring of
//!   FETCH / COMMIT_AND_FETCH commands);
//! - [`server`]: the request mapping and the per-tag state machine, one
//!   ublk queue on one engine queue pair;
//! - [`target`]: what the server needs beyond `BlockQueue` (FUA, Write
//!   Zeroes), the device's capabilities, errno mapping;
//! - [`device`]: parameters from what the engine reports, and one pinned
//!   thread per queue through [`mcqio::run_per_core`];
//! - [`recover`]: USER_RECOVERY, taking over a device whose server died;
//! - [`null`]: a diagnostic target answering every request at once
//!   (`--null`), to split a request's cost into ublk, copy and engine;
//! - [`fake`]: the kernel's side of a queue in memory, so `cargo test`
//!   covers the server without a ublk driver.
//!
//! ## The data path
//!
//! One thread per queue, pinned by [`mcqio::run_per_core`], owns one ublk
//! queue and one engine queue pair and polls both: it peeks the ublk
//! completion ring (no system call), sends new requests to the engine,
//! rings the engine's doorbell once per batch, takes the engine's
//! completions, and enters the kernel once per batch of
//! COMMIT_AND_FETCH commands (none in a pass that queued no commit).
//!
//! Idle, it sleeps in **one** `io_uring_enter(min_complete = 1)` that
//! ends on whichever side has work first: the ublk ring's next request,
//! or — while the engine owes completions — the engine queue's interrupt,
//! whose descriptor (an eventfd; on NVMe/TCP an epoll set holding the
//! queue's socket) is watched by a one-shot poll on the same ring. The
//! order is the engine's (arm the interrupt, poll once more, then
//! sleep), so no completion is left waiting on a sleep ([`server`] has
//! the argument). `--wait` picks the policy, the engine queue pair's
//! [`mcqio::WaitPolicy`]: `irq` (the default) sleeps as soon as a pass
//! finds nothing, `hybrid:SPIN` spins SPIN first, `poll` spins while the
//! engine owes completions (and sleeps only when it owes none). Under
//! emulation (QEMU TCG), where the guest's vCPUs and the emulated
//! controller share the host's cores, a spinning server slows the device
//! it waits for; fixtures/vm/README.md ("ublk") has the measurements.
//!
//! Data is **copied**: each tag owns a buffer in the engine's DMA-mapped
//! memory (a [`mcqio::DmaBuf`], allocated once), given to the kernel as
//! the FETCH / COMMIT address; the kernel copies a WRITE's pages into it
//! before handing the request over and a READ's data out of it on commit,
//! and the device DMAs into and out of that same buffer. Kernel
//! zero-copy buffers (6.15+) are reachable only through an io_uring
//! buffer index, never by VFIO DMA, so a VFIO-backed server cannot use
//! them (SPDK's ublk target copies for the same reason). `--user-copy`
//! selects USER_COPY instead: the data moves by `pread`/`pwrite` on
//! `/dev/ublkcN` (one more system call per request; the same buffers).
//!
//! Large requests are not split here: `max_sectors` is the tag buffer,
//! at most the engine's max transfer (MDTS / PRDT limits), and anything
//! the engine must split it splits itself.
//!
//! ## Why a thin layer over `io-uring`, not libublk
//!
//! libublk 0.4.8 works (its `null` example served `/dev/ublkb0` in our
//! 6.12 guest) but does not fit a polled engine: its per-queue loop
//! (`wait_and_handle_io`, or the smol executor of its async path) owns
//! the thread and blocks in `io_uring_enter` for the next ublk event,
//! while mcqio's queue pair has to be polled in between; interleaving
//! needs to peek the ublk completion ring *without* a system call and to
//! decide per pass whether to enter the kernel at all. Its `-sys` crate
//! also runs bindgen at build time, which needs libclang installed by
//! our own set-up. The ABI a 6.12 server needs is five small structs and
//! a dozen command numbers ([`sys`], checked against the header's
//! layout), and the `io-uring` crate (0.7, already used by mcqio-perf)
//! gives `UringCmd16` / `UringCmd80` and direct access to both rings — so
//! this crate is about as long as the glue libublk would have needed.
//!
//! ## Lifecycle
//!
//! `add` creates the device (ADD_DEV, SET_PARAMS), opens `/dev/ublkcN`,
//! starts one thread per queue (each FETCHes all its tags), then
//! START_DEV; it serves in the foreground until SIGINT or SIGTERM, then
//! STOP_DEV (the kernel aborts every fetch), waits for the engine's last
//! completions, closes the character device and DEL_DEV. `del` removes a
//! device whose server is gone (or stops a live one: its queues are
//! aborted and it exits); `list` shows the devices.
//!
//! `add --recovery` (VFIO devices only) sets `USER_RECOVERY |
//! USER_RECOVERY_REISSUE`: if the server dies (`kill -9`, a crash), the
//! block device stays, its requests wait, and `recover <device-string>
//! --id N` takes it over with a new server — the sequence, and why a fake
//! cannot be recovered, are in [`recover`].
//!
//! **Do not run the server in a mount namespace that uses its own
//! device.** If a filesystem on `/dev/ublkbN` is mounted where the server
//! runs, and the server (or anything it waits for, e.g. a page fault on a
//! file there, or `umount` during shutdown) needs I/O on that filesystem,
//! it waits on itself: the requests that would complete it sit in its own
//! queue. Start `mcqio-ublk` before mounting, keep its binary and
//! anything it reads off the device, and unmount before stopping it (the
//! guest test plan mounts under `/mnt` and runs the server from the
//! initramfs).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod ctrl;
pub mod device;
pub mod fake;
pub mod null;
pub mod queue;
pub mod recover;
pub mod server;
pub mod sys;
pub mod target;
