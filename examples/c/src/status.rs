//! What every call returns: a [`Status`] (0 or a negative code), the
//! thread's last error message, and the guard that keeps panics on the
//! Rust side of the boundary.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};

use engine::nvme::spec::status::{generic, sct};
use engine::{IoError, SubmitErrorKind, UfsError};

/// The result of a call: `MCQIO_STATUS_OK` (0) or a negative code saying what
/// went wrong; `mcqio_last_error()` says it in words. The same codes are a
/// completion's `status`. Calls that return a count return it as a
/// non-negative `int`, or one of these.
#[repr(i32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// An argument cannot be used: a null handle or pointer, an option out
    /// of range, a buffer of another device, a zero-length transfer.
    Invalid = -1,
    /// The device string names no device, or gives an option the device
    /// does not take.
    Devstr = -2,
    /// The device string names a device that could not be opened or
    /// brought up (no such PCI function, not bound to vfio-pci, no
    /// target at the address, the controller did not become ready).
    Open = -3,
    /// No DMA memory of that size could be allocated and mapped.
    Nomem = -4,
    /// The object is busy: a buffer still owned by a queue pair (freed or
    /// submitted again before its completion), or a queue pair polled,
    /// waited on or destroyed from inside one of its own callbacks.
    Busy = -5,
    /// Every slot of the queue pair is in flight: poll, then resubmit.
    QueueFull = -6,
    /// The controller has no free I/O queue for another queue pair.
    NoQueue = -7,
    /// The blocks run past the end of the unit, the buffer is smaller than
    /// the transfer, or the transfer is larger than the queue can carry.
    Range = -8,
    /// No namespace (NVMe) or logical unit (UFS) has this id.
    NoUnit = -9,
    /// The device does not support the command.
    Unsupported = -10,
    /// The device completed the command with an error status (a
    /// completion's `detail` holds it).
    Io = -11,
    /// The command did not complete within the queue pair's timeout and
    /// was aborted; it may be resubmitted.
    TimedOut = -12,
    /// The host ended the command (queue pair destroyed, controller
    /// reset), or the device did because the host deleted its queue (NVMe
    /// "aborted: SQ deletion", in `detail`); it may or may not have
    /// executed: resubmit it.
    Aborted = -13,
    /// NVMe/TCP: the connection that carried the command ended; it may or
    /// may not have executed.
    ConnLost = -14,
    /// The controller failed or was removed; nothing more is accepted.
    Failed = -15,
    /// An internal error of the library (a panic, caught at the boundary).
    Internal = -16,
}

/// Every status, for `mcqio_strerror()` and the tests.
pub(crate) const ALL: [Status; 17] = [
    Status::Ok,
    Status::Invalid,
    Status::Devstr,
    Status::Open,
    Status::Nomem,
    Status::Busy,
    Status::QueueFull,
    Status::NoQueue,
    Status::Range,
    Status::NoUnit,
    Status::Unsupported,
    Status::Io,
    Status::TimedOut,
    Status::Aborted,
    Status::ConnLost,
    Status::Failed,
    Status::Internal,
];

impl Status {
    /// A fixed sentence for the status.
    pub(crate) fn text(self) -> &'static CStr {
        match self {
            Status::Ok => c"success",
            Status::Invalid => c"invalid argument",
            Status::Devstr => c"the device string names no device, or an option it does not take",
            Status::Open => c"the device could not be opened",
            Status::Nomem => c"no DMA memory of that size",
            Status::Busy => c"busy: the buffer is owned by a queue pair, or the queue pair is in one of its callbacks",
            Status::QueueFull => c"queue full: poll for completions, then resubmit",
            Status::NoQueue => c"the controller has no free I/O queue",
            Status::Range => c"out of range: blocks past the unit's end, a buffer too small or a transfer too large",
            Status::NoUnit => c"no namespace or logical unit has this id",
            Status::Unsupported => c"the device does not support this command",
            Status::Io => c"the device completed the command with an error status",
            Status::TimedOut => c"the command timed out and was aborted",
            Status::Aborted => c"the command was ended by the host (queue pair destroyed or controller reset)",
            Status::ConnLost => c"the connection carrying the command ended",
            Status::Failed => c"the controller failed or was removed",
            Status::Internal => c"internal error of libmcqio",
        }
    }
}

/// The last error message of this thread: a fixed sentence, or a formatted
/// one (formatted only on a real error, never for a full queue).
enum Message {
    Fixed(&'static CStr),
    Owned(CString),
}

thread_local! {
    static LAST: RefCell<Message> = const { RefCell::new(Message::Fixed(c"no error")) };
}

/// Record `status` with its fixed sentence as this thread's last error.
pub(crate) fn fail_fixed(status: Status) -> Status {
    LAST.with(|m| *m.borrow_mut() = Message::Fixed(status.text()));
    status
}

/// Record `status` with `why` as this thread's last error.
pub(crate) fn fail(status: Status, why: impl Display) -> Status {
    let text = format!("{}: {why}", status.text().to_string_lossy());
    // A message with a NUL in it is cut there.
    let text = CString::new(text).unwrap_or_else(|e| {
        let n = e.nul_position();
        let mut v = e.into_vec();
        v.truncate(n);
        CString::new(v).unwrap_or_default()
    });
    LAST.with(|m| *m.borrow_mut() = Message::Owned(text));
    status
}

/// Run `f` with panics caught: a panic is [`Status::Internal`].
pub(crate) fn guard(what: &'static str, f: impl FnOnce() -> Result<(), Status>) -> Status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Status::Ok,
        Ok(Err(s)) => s,
        Err(_) => fail(Status::Internal, format_args!("panic in {what}")),
    }
}

/// [`guard`] for a call that returns a count: the count, or the status.
pub(crate) fn guard_count(what: &'static str, f: impl FnOnce() -> Result<usize, Status>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => c_int::try_from(n).unwrap_or(c_int::MAX),
        Ok(Err(s)) => s as c_int,
        Err(_) => fail(Status::Internal, format_args!("panic in {what}")) as c_int,
    }
}

/// For a call that makes a handle: `*out` is NULL until `make` succeeds,
/// then the new handle (`Box::into_raw`); a NULL `out` is
/// [`Status::Invalid`].
///
/// # Safety
/// `out` is null or valid for one pointer write.
pub(crate) unsafe fn new_handle<T>(
    out: *mut *mut T,
    make: impl FnOnce() -> Result<Box<T>, Status>,
) -> Result<(), Status> {
    if out.is_null() {
        return Err(fail(Status::Invalid, "out is NULL"));
    }
    // SAFETY: `out` is valid for one write (caller contract).
    unsafe { out.write(std::ptr::null_mut()) };
    let handle = make()?;
    // SAFETY: as above.
    unsafe { out.write(Box::into_raw(handle)) };
    Ok(())
}

/// The status of a refused submission (its message recorded).
pub(crate) fn submit_status(kind: SubmitErrorKind) -> Status {
    use SubmitErrorKind as K;
    let status = match kind {
        // The one refusal of a busy, healthy queue: no formatting.
        K::QueueFull => return fail_fixed(Status::QueueFull),
        K::LbaOutOfRange { .. }
        | K::BufferTooSmall { .. }
        | K::TransferTooLarge { .. }
        | K::BadRangeCount { .. } => Status::Range,
        K::UnknownNamespace { .. } | K::UnknownLun { .. } => Status::NoUnit,
        K::Unsupported(_) => Status::Unsupported,
        K::ControllerFailed => Status::Failed,
        _ => Status::Invalid,
    };
    fail(status, kind)
}

/// NVMe's "Command Aborted due to SQ Deletion" (whatever its DNR, More
/// and CRD bits).
fn sq_deletion(s: engine::NvmeStatus) -> bool {
    (s.sct, s.sc) == (sct::GENERIC, generic::ABORTED_SQ_DELETION)
}

/// `detail` of an NVMe status: `(SCT << 8) | SC`.
fn nvme_detail(s: engine::NvmeStatus) -> u32 {
    u32::from(s.sct) << 8 | u32::from(s.sc)
}

/// The status and detail of a command's result. `detail` for
/// [`Status::Io`]: NVMe `(SCT << 8) | SC`; UFS the SCSI status byte (0 for
/// a transport or response error).
pub(crate) fn io_status(r: &Result<(), IoError>) -> (Status, u32) {
    match r {
        Ok(()) => (Status::Ok, 0),
        // Posted by the device for what it had fetched when the host
        // deleted the queue (destroying the queue pair does): ended by the
        // host, as the engine's own `Aborted` is.
        Err(IoError::Nvme(s)) if sq_deletion(*s) => (Status::Aborted, nvme_detail(*s)),
        Err(IoError::Nvme(s)) => (Status::Io, nvme_detail(*s)),
        Err(IoError::Ufs(UfsError::Scsi { status, .. })) => (Status::Io, u32::from(status.0)),
        Err(IoError::TimedOut) => (Status::TimedOut, 0),
        Err(IoError::Aborted | IoError::AbortedByReset) => (Status::Aborted, 0),
        Err(IoError::ConnectionLost) => (Status::ConnLost, 0),
        Err(IoError::ControllerFailed) => (Status::Failed, 0),
        Err(_) => (Status::Io, 0),
    }
}

/// The status of a failed control-path call (its message recorded).
pub(crate) fn engine_status(e: engine::Error) -> Status {
    use engine::Error as E;
    let status = match &e {
        E::Dma(_) => Status::Nomem,
        E::NoFreeQueue { .. } | E::NotEnoughQueues { .. } => Status::NoQueue,
        E::InvalidOption(_) => Status::Invalid,
        E::Submit(k) => return submit_status(*k),
        E::Io(io) => io_status(&Err(*io)).0,
        E::ControllerFatal | E::DeviceGone => Status::Failed,
        _ => Status::Io,
    };
    fail(status, e)
}

/// A fixed sentence for `status`, for any value (an unknown one says so).
/// The string is static: never free it.
#[no_mangle]
pub extern "C" fn mcqio_strerror(status: c_int) -> *const c_char {
    ALL.iter()
        .find(|s| **s as c_int == status)
        .map_or(c"unknown mcqio status", |s| s.text())
        .as_ptr()
}

/// The message of the last call of this thread that failed, saying what
/// and why (for a completion's status, see `mcqio_strerror()`). Calls
/// that succeed leave it as it was. The string belongs to the library and
/// stays valid until this thread's next failing call: copy it to keep it.
#[no_mangle]
pub extern "C" fn mcqio_last_error() -> *const c_char {
    LAST.with(|m| match &*m.borrow() {
        Message::Fixed(s) => s.as_ptr(),
        Message::Owned(s) => s.as_ptr(),
    })
}
