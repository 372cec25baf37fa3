//! The `extern "C"` functions the fio shim calls (see
//! `examples/fio/mcqio_fio.h`). Every function catches panics, so none
//! unwinds into C; errors come back as a return value plus a message.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::job::{Job, Op, Queued};
use crate::spec::{self, DeviceOptions};
use crate::EngineError;

/// Engine options as the shim passes them (`struct mcqio_fio_config`).
#[repr(C)]
#[derive(Debug)]
pub struct Config {
    /// `dma`.
    pub dma: *const c_char,
    /// `hugepages`.
    pub hugepages: *const c_char,
    /// `dma_budget`.
    pub dma_budget: u64,
    /// `qpairs`.
    pub qpairs: u32,
    /// `shadow_doorbells`.
    pub shadow_doorbells: u32,
    /// `io_timeout`, with its unit (`30s`, `500ms`; `0`: none).
    pub io_timeout: *const c_char,
    /// `fake_size`.
    pub fake_size: u64,
    /// `fake_lbs`.
    pub fake_lbs: u32,
    /// `fake_namespaces`.
    pub fake_namespaces: u32,
    /// `fake_exec`.
    pub fake_exec: *const c_char,
    /// `fake_latency`, with its unit (`10us`, `1ms`; `0`: none).
    pub fake_latency: *const c_char,
    /// `fake_core` (-1: not pinned).
    pub fake_core: i64,
    /// `mcq` (UFS: 1 use MCQ when the controller has it, 0 the legacy list).
    pub mcq: u32,
    /// The job's smallest block size (fio's `td_min_bs`; 0: not checked).
    pub min_bs: u64,
    /// `wait`: `poll` (default), `irq`, `hybrid` or `hybrid:SPIN`.
    pub wait: *const c_char,
    /// fio's `hipri` (1: polled completions, as io_uring's hipri asks).
    pub hipri: u32,
}

/// Per-file answer of [`mcqio_fio_setup`] (`struct mcqio_fio_file`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FileOut {
    /// Capacity in bytes.
    pub size: u64,
    /// The cookie `queue` takes.
    pub cookie: u64,
}

/// Operation codes of `mcqio_fio_queue` (mcqio_fio.h).
const OP_READ: c_int = 0;
const OP_WRITE: c_int = 1;
const OP_TRIM: c_int = 2;
const OP_FLUSH: c_int = 3;

const QUEUED: c_int = 0;
const BUSY: c_int = 1;
/// `mcqio_fio_init` flag: fio replays this job's verify seeds in the order
/// it logged the writes, so it must never be answered busy
/// (`MCQIO_FIO_INIT_ORDERED_VERIFY`).
const INIT_ORDERED_VERIFY: u32 = 1;

/// Copy `msg` into the caller's buffer, truncated and NUL-terminated.
///
/// # Safety
/// `err` is null or valid for `len` bytes of writes.
unsafe fn put_err(err: *mut c_char, len: usize, msg: &str) {
    if err.is_null() || len == 0 {
        return;
    }
    let n = msg.len().min(len - 1);
    // SAFETY: n + 1 <= len bytes at `err` are writable (caller contract);
    // `msg` is a separate Rust string.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

/// Run `f`, turning a panic into [`EngineError::Panic`].
fn guarded<T>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(EngineError::Panic(what)))
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn opt_str<'a>(p: *const c_char) -> Result<&'a str, EngineError> {
    if p.is_null() {
        return Ok("");
    }
    // SAFETY: non-null and NUL-terminated (caller contract).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| EngineError::Abi("option is not UTF-8"))
}

/// `fake_core=-2`, the default: pin the fake's device thread to the
/// highest CPU this process may use, as mcqio-perf keeps it off the job
/// cores (fio's job threads start on the low ones). An unpinned device
/// thread gave 576k, 533k, then 8k IOPS for the same job on a busy
/// machine.
const FAKE_CORE_AUTO: i64 = -2;

/// The highest CPU in this process's affinity mask (`None` if unknown).
fn highest_allowed_cpu() -> Option<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes
    // into the owned `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads the initialised set; the index is in range.
    (0..libc::CPU_SETSIZE as usize)
        .rev()
        .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
}

/// # Safety
/// The strings in `c` are null or NUL-terminated.
unsafe fn device_options(c: &Config) -> Result<DeviceOptions, EngineError> {
    // SAFETY: forwarded caller contract on each string.
    let (dma, huge, exec, timeout, latency, wait) = unsafe {
        (
            opt_str(c.dma)?,
            opt_str(c.hugepages)?,
            opt_str(c.fake_exec)?,
            opt_str(c.io_timeout)?,
            opt_str(c.fake_latency)?,
            opt_str(c.wait)?,
        )
    };
    // The same rule as a device string's `latency=`: a unit on every
    // duration (fio itself reads a bare number as microseconds,
    // mcqio-perf read it as seconds).
    let duration = |key, v: &str| match v {
        "" => Ok(Duration::ZERO),
        v => mcqio_open::devstr::parse_device_duration(key, v).map_err(spec::SpecError::from),
    };
    let io_timeout = duration("io_timeout", timeout)?;
    let fake_latency = duration("fake_latency", latency)?;
    spec::DmaMode::parse(dma)?;
    let bad = |option, value: String, why| spec::SpecError::BadOption { option, value, why };
    let qpairs = u16::try_from(c.qpairs)
        .ok()
        .filter(|q| (1..u16::MAX).contains(q))
        .ok_or_else(|| bad("qpairs", c.qpairs.to_string(), "use 1 to 65534"))?;
    if !c.fake_lbs.is_power_of_two() || !(512..=65536).contains(&c.fake_lbs) {
        return Err(bad(
            "fake_lbs",
            c.fake_lbs.to_string(),
            "use a power of two from 512 to 65536",
        )
        .into());
    }
    if c.fake_size < u64::from(c.fake_lbs) {
        return Err(bad(
            "fake_size",
            c.fake_size.to_string(),
            "must hold at least one block",
        )
        .into());
    }
    if c.fake_namespaces == 0 || c.fake_namespaces > 1024 {
        return Err(bad(
            "fake_namespaces",
            c.fake_namespaces.to_string(),
            "use 1 to 1024",
        )
        .into());
    }
    // fio's polling convention: `hipri` asks for polled completions
    // (io_uring's IORING_SETUP_IOPOLL); `wait=` says it in mcqio's words.
    let wait_str = wait.trim();
    let wait = match wait_str {
        "" => mcqio::WaitPolicy::Poll,
        w => w.parse::<mcqio::WaitPolicy>().map_err(|_| {
            bad(
                "wait",
                w.to_string(),
                "use poll, irq, hybrid or hybrid:SPIN (hybrid:20us)",
            )
        })?,
    };
    if c.hipri != 0 && wait != mcqio::WaitPolicy::Poll {
        return Err(bad(
            "hipri",
            format!("1 with wait={wait_str}"),
            "hipri asks for polled completions; it contradicts wait=irq|hybrid",
        )
        .into());
    }
    let fake_core = match c.fake_core {
        -1 => None,
        FAKE_CORE_AUTO => highest_allowed_cpu(),
        n => Some(usize::try_from(n).map_err(|_| {
            bad(
                "fake_core",
                n.to_string(),
                "use a core number, -1 (not pinned) or -2 (the highest CPU the process may use)",
            )
        })?),
    };
    Ok(DeviceOptions {
        huge_pages: spec::parse_huge_pages(huge)?,
        dma_budget: c.dma_budget,
        qpairs,
        shadow_doorbells: c.shadow_doorbells != 0,
        mcq: c.mcq != 0,
        io_timeout: (!io_timeout.is_zero()).then_some(io_timeout),
        fake_size: c.fake_size,
        fake_lbs: c.fake_lbs,
        fake_namespaces: c.fake_namespaces,
        fake_exec: spec::parse_fake_exec(exec)?,
        fake_latency,
        fake_core,
        wait,
    })
}

/// Parse the options and filenames, open (or share) the controller, and
/// return the job's handle (null on error, with `err` filled in).
///
/// # Safety
/// `cfg` points to a valid config whose strings are null or NUL-terminated;
/// `names` and `out` hold `nfiles` entries (each name NUL-terminated);
/// `err` is null or valid for `errlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_setup(
    cfg: *const Config,
    names: *const *const c_char,
    nfiles: u32,
    max_io: u64,
    out: *mut FileOut,
    err: *mut c_char,
    errlen: usize,
) -> *mut c_void {
    let r = guarded("setup", || {
        if cfg.is_null() || (nfiles > 0 && (names.is_null() || out.is_null())) {
            return Err(EngineError::Abi("null pointer"));
        }
        // SAFETY: non-null and valid (caller contract).
        let opts = unsafe { device_options(&*cfg)? };
        let n = nfiles as usize;
        let list: Vec<&str> = (0..n)
            .map(|i| {
                // SAFETY: `names` holds `nfiles` NUL-terminated strings.
                unsafe { opt_str(*names.add(i)) }
            })
            .collect::<Result<_, _>>()?;
        let (job, files) = Job::setup(&list, &opts, max_io)?;
        // SAFETY: non-null and valid (caller contract).
        let min_bs = unsafe { (*cfg).min_bs };
        crate::job::check_block_sizes(&files, &list, min_bs, max_io)?;
        for (i, f) in files.iter().enumerate() {
            // SAFETY: `out` holds `nfiles` entries and files.len() == nfiles.
            unsafe {
                out.add(i).write(FileOut {
                    size: f.size,
                    cookie: f.cookie(),
                })
            };
        }
        Ok(Box::into_raw(Box::new(job)).cast::<c_void>())
    });
    r.unwrap_or_else(|e| {
        // SAFETY: caller contract on err/errlen.
        unsafe { put_err(err, errlen, &e.to_string()) };
        std::ptr::null_mut()
    })
}

/// # Safety
/// `job` came from [`mcqio_fio_setup`] and was not cleaned up; no other
/// thread uses it during the call.
unsafe fn job_mut<'a>(job: *mut c_void) -> Option<&'a mut Job> {
    // SAFETY: a live Box<Job> pointer or null (caller contract), used by
    // one thread at a time (fio calls a job's engine hooks from its thread).
    unsafe { job.cast::<Job>().as_mut() }
}

/// Create the job's queue pair of `depth` entries on the calling thread.
///
/// # Safety
/// `job` is null or a live handle from [`mcqio_fio_setup`] (not yet cleaned up), used by one thread at a time; `err` is null or valid for `errlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_init(
    job: *mut c_void,
    depth: u32,
    flags: u32,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    // SAFETY: caller contract.
    let r = guarded("init", || match unsafe { job_mut(job) } {
        Some(j) => j.init_with(depth, flags & INIT_ORDERED_VERIFY != 0),
        None => Err(EngineError::Abi("null job")),
    });
    match r {
        Ok(()) => 0,
        Err(e) => {
            // SAFETY: caller contract on err/errlen.
            unsafe { put_err(err, errlen, &e.to_string()) };
            1
        }
    }
}

/// Allocate fio's I/O buffers as one DMA region; null on error.
///
/// # Safety
/// As for [`mcqio_fio_init`].
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_iomem_alloc(
    job: *mut c_void,
    len: usize,
    err: *mut c_char,
    errlen: usize,
) -> *mut c_void {
    // SAFETY: caller contract.
    let r = guarded("iomem_alloc", || match unsafe { job_mut(job) } {
        Some(j) => j.alloc_buffers(len),
        None => Err(EngineError::Abi("null job")),
    });
    match r {
        Ok(p) => p.cast::<c_void>(),
        Err(e) => {
            // SAFETY: caller contract on err/errlen.
            unsafe { put_err(err, errlen, &e.to_string()) };
            std::ptr::null_mut()
        }
    }
}

/// Free fio's I/O buffers (closing the queue pair first if anything is in flight).
///
/// # Safety
/// `job` is null or a live handle from [`mcqio_fio_setup`] (not yet cleaned up), used by one thread at a time; fio no longer uses the buffers.
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_iomem_free(job: *mut c_void) {
    let _ = guarded("iomem_free", || {
        // SAFETY: caller contract.
        if let Some(j) = unsafe { job_mut(job) } {
            j.free_buffers();
        }
        Ok(())
    });
}

/// Queue one command: 0 queued, 1 busy, or a negative errno (completed).
///
/// # Safety
/// `job` is null or a live handle from [`mcqio_fio_setup`] (not yet cleaned up), used by one thread at a time. `buf` need not be valid: it is checked to lie in the
/// job's buffers before use.
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_queue(
    job: *mut c_void,
    cookie: u64,
    op: c_int,
    offset: u64,
    buf: *const c_void,
    len: u64,
    tag: u64,
) -> c_int {
    let op = match op {
        OP_READ => Op::Read,
        OP_WRITE => Op::Write,
        OP_TRIM => Op::Trim,
        OP_FLUSH => Op::Flush,
        _ => return -libc::EINVAL,
    };
    let r = guarded("queue", || {
        // SAFETY: caller contract.
        let Some(j) = (unsafe { job_mut(job) }) else {
            return Err(EngineError::Abi("null job"));
        };
        Ok(j.queue(cookie, op, offset, buf.cast::<u8>(), len, tag))
    });
    match r {
        Ok(Queued::Queued) => QUEUED,
        Ok(Queued::Busy) => BUSY,
        Ok(Queued::Failed(errno)) => -errno,
        Err(_) => -libc::EIO,
    }
}

/// Ring the doorbell for what was queued.
///
/// # Safety
/// `job` is null or a live handle from [`mcqio_fio_setup`] (not yet cleaned up), used by one thread at a time.
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_commit(job: *mut c_void) {
    let _ = guarded("commit", || {
        // SAFETY: caller contract.
        if let Some(j) = unsafe { job_mut(job) } {
            j.commit();
        }
        Ok(())
    });
}

/// Poll for `min..=max` completions (`timeout_ns` < 0: no timeout). Returns
/// the count, or -1 with `err` filled in.
///
/// # Safety
/// As for [`mcqio_fio_init`].
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_getevents(
    job: *mut c_void,
    min: u32,
    max: u32,
    timeout_ns: i64,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    let timeout = u64::try_from(timeout_ns).ok().map(Duration::from_nanos);
    let r = guarded("getevents", || {
        // SAFETY: caller contract.
        let Some(j) = (unsafe { job_mut(job) }) else {
            return Err(EngineError::Abi("null job"));
        };
        j.getevents(min as usize, max as usize, timeout)
    });
    match r {
        Ok(n) => c_int::try_from(n).unwrap_or(c_int::MAX),
        Err(e) => {
            // SAFETY: caller contract on err/errlen.
            unsafe { put_err(err, errlen, &e.to_string()) };
            -1
        }
    }
}

/// Completion `i` of the last getevents: its tag, and its errno in `*errno_out`.
///
/// # Safety
/// `job` is null or a live handle from [`mcqio_fio_setup`] (not yet cleaned up), used by one thread at a time; `errno_out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_event(job: *mut c_void, i: u32, errno_out: *mut c_int) -> u64 {
    let r = guarded("event", || {
        // SAFETY: caller contract.
        let j = unsafe { job_mut(job) }.ok_or(EngineError::Abi("null job"))?;
        j.event(i as usize).ok_or(EngineError::Abi("event index"))
    });
    let (tag, errno) = match r {
        Ok(e) => (e.tag, e.errno),
        Err(_) => (0, libc::EIO),
    };
    if !errno_out.is_null() {
        // SAFETY: non-null and writable (caller contract).
        unsafe { *errno_out = errno };
    }
    tag
}

/// Close the job's queue pair and free the job; the controller closes when
/// its last job is cleaned up.
///
/// # Safety
/// `job` came from [`mcqio_fio_setup`] (or is null) and is not used again.
#[no_mangle]
pub unsafe extern "C" fn mcqio_fio_cleanup(job: *mut c_void) {
    if job.is_null() {
        return;
    }
    // SAFETY: a pointer from Box::into_raw in mcqio_fio_setup, not freed
    // before (caller contract).
    let job = unsafe { Box::from_raw(job.cast::<Job>()) };
    let _ = guarded("cleanup", || job.close());
}

// The job is created on fio's main thread and used on the job's thread.
const _: () = {
    const fn send<T: Send>() {}
    send::<Job>();
};

#[cfg(test)]
mod tests {
    use super::*;

    fn config(io_timeout: &CStr, fake_latency: &CStr) -> Config {
        Config {
            dma: std::ptr::null(),
            hugepages: std::ptr::null(),
            dma_budget: 0,
            qpairs: 4,
            shadow_doorbells: 1,
            io_timeout: io_timeout.as_ptr(),
            fake_size: 1 << 20,
            fake_lbs: 4096,
            fake_namespaces: 1,
            fake_exec: std::ptr::null(),
            fake_latency: fake_latency.as_ptr(),
            fake_core: FAKE_CORE_AUTO,
            mcq: 1,
            min_bs: 4096,
            wait: std::ptr::null(),
            hipri: 0,
        }
    }

    fn options(io_timeout: &CStr, fake_latency: &CStr) -> Result<DeviceOptions, EngineError> {
        // SAFETY: the config's strings are NUL-terminated literals or null.
        unsafe { device_options(&config(io_timeout, fake_latency)) }
    }

    /// fio's polling convention: `hipri` is polling, `wait=`
    /// names the policy, and the two cannot contradict each other.
    #[test]
    fn wait_and_hipri_options() {
        let with = |wait: Option<&CStr>, hipri: u32| {
            let mut c = config(c"30s", c"0");
            c.wait = wait.map_or(std::ptr::null(), CStr::as_ptr);
            c.hipri = hipri;
            // SAFETY: the config's strings are NUL-terminated literals or null.
            unsafe { device_options(&c) }
        };
        assert_eq!(with(None, 0).unwrap().wait, mcqio::WaitPolicy::Poll);
        assert_eq!(with(None, 1).unwrap().wait, mcqio::WaitPolicy::Poll);
        assert_eq!(
            with(Some(c"poll"), 1).unwrap().wait,
            mcqio::WaitPolicy::Poll
        );
        assert_eq!(
            with(Some(c"irq"), 0).unwrap().wait,
            mcqio::WaitPolicy::Interrupt
        );
        assert_eq!(
            with(Some(c"hybrid:20us"), 0).unwrap().wait,
            mcqio::WaitPolicy::Hybrid {
                spin: Duration::from_micros(20)
            }
        );
        let e = with(Some(c"irq"), 1).unwrap_err().to_string();
        assert!(e.contains("hipri"), "{e}");
        let e = with(Some(c"sleepy"), 0).unwrap_err().to_string();
        assert!(e.contains("wait"), "{e}");
    }

    /// `fake_latency=10` was 10 µs here (fio's rule for a
    /// bare time) and `latency=10` 10 s in mcqio-perf. Both now need a
    /// unit, parsed by the one device-string function.
    #[test]
    fn durations_need_a_unit_as_in_device_strings() {
        let o = options(c"30s", c"10us").unwrap();
        assert_eq!(o.fake_latency, Duration::from_micros(10));
        assert_eq!(o.io_timeout, Some(Duration::from_secs(30)));
        let o = options(c"0", c"0").unwrap();
        assert_eq!((o.fake_latency, o.io_timeout), (Duration::ZERO, None));
        // The default fake is pinned, as mcqio-perf's is.
        assert_eq!(o.fake_core, highest_allowed_cpu());
        assert!(o.fake_core.is_some());
        for (t, l, bad) in [
            (c"30s", c"10", "fake_latency=10"),
            (c"30", c"0", "io_timeout=30"),
        ] {
            let e = options(t, l).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("unit"), "{e}");
        }
    }
}
