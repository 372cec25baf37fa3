//! The C ABI of mcqio: `libmcqio.so` and `libmcqio.a`, declared by
//! `include/mcqio.h` (generated from this crate by cbindgen, committed, and
//! checked by `.ci/c-abi`), found through `mcqio.pc`.
//!
//! One program reads from a fake, a controller through VFIO and an
//! NVMe/TCP target with the same code, because the device string goes to
//! the one opener every frontend uses ([`mcqio_open`]) and the queue pair is
//! the opener's one queue type for any wire ([`mcqio_open::Queue`]):
//!
//! - [`device`]: `mcqio_device_open(devstr)`, its units (namespaces or
//!   logical units) and facts, `mcqio_device_close`;
//! - [`buf`]: DMA buffers (`mcqio_buf_alloc`, `_free`, `_data`, `_len`,
//!   `_state`) and their ownership rule, the one [`engine::IoBuf`] states
//!   for Rust: a submitted buffer is the queue pair's until its completion
//!   hands it back; freeing or resubmitting it meanwhile is `MCQIO_STATUS_BUSY`;
//! - [`qpair`]: per-thread queue pairs, `mcqio_submit_read`/`_write`/
//!   `_flush`/`_deallocate` with a user tag, `mcqio_poll` (a C callback),
//!   `mcqio_poll_into` (an array), `mcqio_wait`/`_wait_into` (poll,
//!   interrupt or hybrid, as the queue pair was created), and
//!   `mcqio_qpair_destroy`, which ends every command in flight once;
//! - [`status`]: the typed codes ([`Status`]), `mcqio_strerror` and the
//!   thread's last error message.
//!
//! No panic crosses the boundary: every entry point catches it and returns
//! `MCQIO_STATUS_INTERNAL`. Nothing on the I/O path (submit, poll, wait)
//! allocates or locks; a refusal for a full queue formats no message.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod buf;
pub mod device;
pub mod qpair;
pub mod status;
#[cfg(test)]
mod tests;

pub use buf::{BufState, McqioBuf};
pub use device::{McqioDevice, McqioDeviceInfo, McqioUnit, Transport};
pub use qpair::{McqioCpl, McqioCplFn, McqioQpair, McqioQpairOpts};
pub use status::Status;
