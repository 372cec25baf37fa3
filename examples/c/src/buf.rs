//! `mcqio_buf`: DMA memory C can fill and read, and the ownership rule a
//! queue pair keeps for it: a buffer submitted is the queue pair's until
//! its completion hands it back.
//!
//! The handle is a cell that outlives each command: a submission moves
//! the [`DmaBuf`] out of the cell into the queue pair (as a Rust caller
//! moves it), and the completion moves it back before C sees the
//! completion. The cell's state word makes freeing or resubmitting a
//! buffer in flight a typed error ([`Status::Busy`]) instead of a
//! use-after-free; a completion that cannot hand the memory back (the
//! device may still reach it) leaves the cell *lost*: its memory is
//! leaked, never reused, and the handle can only be freed.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use engine::vfio::DmaDir;
use engine::DmaBuf;

use crate::device::{device, McqioDevice};
use crate::status::{fail, guard, new_handle, Status};

/// The application's: its bytes may be read and written.
const IDLE: u8 = 0;
/// Owned by a queue pair: the device may read or write it.
const IN_FLIGHT: u8 = 1;
/// Its command ended without the device being provably done with it.
const LOST: u8 = 2;

/// Where a buffer is in its life (`mcqio_buf_state_of()`).
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BufState {
    /// The application's: its bytes may be read and written, it may be
    /// submitted or freed.
    Idle = 0,
    /// Owned by a queue pair, from its submission until its completion is
    /// delivered: do not touch its bytes; freeing or submitting it is
    /// refused with `MCQIO_STATUS_BUSY`.
    InFlight = 1,
    /// Its command completed with the `MCQIO_CPL_BUF_LOST` flag: the device
    /// may still access the memory, so it is leaked (never reused, never
    /// unmapped) and has no data pointer; only `mcqio_buf_free()` is left,
    /// which frees the handle.
    Lost = 2,
}

/// A DMA buffer. Opaque to C.
pub struct McqioBuf {
    state: AtomicU8,
    /// `Some` while idle; written only by the thread that moved the state
    /// away from or back to idle.
    buf: UnsafeCell<Option<DmaBuf>>,
    data: NonNull<u8>,
    len: usize,
}

impl McqioBuf {
    /// Move the memory out for a submission: [`Status::Busy`] if a queue
    /// pair owns it, [`Status::Invalid`] if it is lost.
    pub(crate) fn take(&self) -> Result<DmaBuf, Status> {
        // Acquire: the idle state and the memory the last completion put
        // back (`put`'s Release store) are seen together.
        match self
            .state
            .compare_exchange(IDLE, IN_FLIGHT, Ordering::Acquire, Ordering::Relaxed)
        {
            // SAFETY: the exchange made this thread the cell's only user
            // until it stores the state again.
            Ok(_) => unsafe { (*self.buf.get()).take() }
                .ok_or_else(|| fail(Status::Internal, "an idle buffer without memory")),
            Err(IN_FLIGHT) => Err(fail(
                Status::Busy,
                "the buffer is owned by a queue pair until its completion",
            )),
            Err(_) => Err(fail(
                Status::Invalid,
                "the buffer was lost (its command ended without the device being done with it)",
            )),
        }
    }

    /// Hand the memory back (a completion, or a refused submission).
    pub(crate) fn put(&self, b: DmaBuf) {
        // SAFETY: the state is IN_FLIGHT, set by this cell's `take`: no
        // other call reads or writes `buf` until the store below.
        unsafe { *self.buf.get() = Some(b) };
        // Release: whoever sees IDLE sees the memory stored above.
        self.state.store(IDLE, Ordering::Release);
    }

    /// The command ended without the memory: it stays leaked.
    pub(crate) fn lose(&self) {
        self.state.store(LOST, Ordering::Release);
    }

    /// Where the buffer is.
    fn state(&self) -> BufState {
        match self.state.load(Ordering::Acquire) {
            IDLE => BufState::Idle,
            IN_FLIGHT => BufState::InFlight,
            _ => BufState::Lost,
        }
    }
}

/// The cell behind a pointer C passes, or [`Status::Invalid`].
///
/// # Safety
/// `buf` is null or a handle from `mcqio_buf_alloc()` not yet freed.
pub(crate) unsafe fn cell<'a>(buf: *const McqioBuf) -> Result<&'a McqioBuf, Status> {
    // SAFETY: null or a live handle (caller contract); only shared
    // references are made to a cell, whose mutable parts are the atomic
    // state and the UnsafeCell it guards.
    unsafe { buf.as_ref() }.ok_or_else(|| fail(Status::Invalid, "the buffer is NULL"))
}

/// Allocate `len` bytes of DMA memory of `dev` (pinned and mapped for the
/// device, in whole pages), readable and writable by the device, and make
/// it a buffer, idle. A buffer is used with queue
/// pairs of the device it was allocated from; it may outlive the device
/// handle.
///
/// # Safety
/// `dev` is NULL or a live device handle; `out` is NULL or valid for one
/// pointer write.
#[no_mangle]
pub unsafe extern "C" fn mcqio_buf_alloc(
    dev: *const McqioDevice,
    len: usize,
    out: *mut *mut McqioBuf,
) -> Status {
    guard("mcqio_buf_alloc", || {
        let make = || {
            // SAFETY: forwarded caller contract.
            let d = unsafe { device(dev) }?;
            if len == 0 {
                return Err(fail(Status::Invalid, "a buffer of 0 bytes"));
            }
            let b = DmaBuf::alloc(d.device.dma(), len, DmaDir::Bidirectional)
                .map_err(|e| fail(Status::Nomem, format_args!("{len} bytes: {e}")))?;
            Ok(Box::new(McqioBuf {
                state: AtomicU8::new(IDLE),
                data: b.as_ptr(),
                len: b.len(),
                buf: UnsafeCell::new(Some(b)),
            }))
        };
        // SAFETY: `out` is NULL or valid for one write (caller contract).
        unsafe { new_handle(out, make) }
    })
}

/// Free a buffer (NULL: nothing to do). A buffer in flight is refused with
/// `MCQIO_STATUS_BUSY` and stays as it is; a lost one frees only its handle (the
/// memory stays leaked).
///
/// # Safety
/// `buf` is NULL or a handle from `mcqio_buf_alloc()` not yet freed; no
/// other thread calls a function on it meanwhile (a queue pair completing
/// it on another thread is fine: that is what `MCQIO_STATUS_BUSY` covers), and
/// nobody uses it after it was freed.
#[no_mangle]
pub unsafe extern "C" fn mcqio_buf_free(buf: *mut McqioBuf) -> Status {
    guard("mcqio_buf_free", || {
        if buf.is_null() {
            return Ok(());
        }
        // SAFETY: forwarded caller contract.
        let c = unsafe { cell(buf) }?;
        // Acquire: the memory a completion put back is seen with IDLE.
        match c
            .state
            .compare_exchange(IDLE, LOST, Ordering::Acquire, Ordering::Relaxed)
        {
            // SAFETY: the exchange made this thread the cell's only user.
            Ok(_) => drop(unsafe { (*c.buf.get()).take() }),
            Err(IN_FLIGHT) => {
                return Err(fail(
                    Status::Busy,
                    "the buffer is owned by a queue pair until its completion",
                ))
            }
            Err(_) => {}
        }
        // SAFETY: a live handle made by Box::into_raw, idle (now marked
        // lost, so no queue pair can take it) or lost, so no queue pair
        // refers to it; the caller gives it up (contract).
        drop(unsafe { Box::from_raw(buf) });
        Ok(())
    })
}

/// The buffer's first byte (NULL for NULL or a lost buffer). The address
/// does not change during the buffer's life. Read and write the bytes only
/// while the buffer is idle: between a submission and the delivery of its
/// completion the device may read or write them at any moment, and
/// touching them then is a data race with the device (undefined).
///
/// # Safety
/// `buf` is NULL or a live buffer handle.
#[no_mangle]
pub unsafe extern "C" fn mcqio_buf_data(buf: *const McqioBuf) -> *mut c_void {
    // SAFETY: forwarded caller contract.
    match unsafe { buf.as_ref() } {
        Some(c) if c.state() != BufState::Lost => c.data.as_ptr().cast(),
        _ => std::ptr::null_mut(),
    }
}

/// The buffer's length in bytes, as allocated (0 for NULL).
///
/// # Safety
/// `buf` is NULL or a live buffer handle.
#[no_mangle]
pub unsafe extern "C" fn mcqio_buf_len(buf: *const McqioBuf) -> usize {
    // SAFETY: forwarded caller contract.
    unsafe { buf.as_ref() }.map_or(0, |c| c.len)
}

/// Where the buffer is in its life (NULL: lost, as nothing can be done
/// with it).
///
/// # Safety
/// `buf` is NULL or a live buffer handle.
#[no_mangle]
pub unsafe extern "C" fn mcqio_buf_state_of(buf: *const McqioBuf) -> BufState {
    // SAFETY: forwarded caller contract.
    unsafe { buf.as_ref() }.map_or(BufState::Lost, McqioBuf::state)
}
