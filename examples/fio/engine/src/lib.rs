//! # mcqio-fio: the Rust half of mcqio's fio external ioengine
//!
//! fio loads `libmcqio_fio.so` (built by `examples/fio/build.sh`) with
//! `--ioengine=external:<path>`. The shared object is a small C shim
//! (`examples/fio/mcqio_fio.c`, compiled against fio's configured source
//! tree) linked with this static library; the shim turns fio's structures
//! into the narrow C ABI of [`ffi`] (declared in `examples/fio/mcqio_fio.h`).
//!
//! - [`spec`]: `--filename` in mcqio's syntax (`fake`, `fake-ufs`,
//!   `vfio-0000.01.00.0`, `,ns=N`, `,lun=N`) and the engine options.
//! - [`device`]: controllers shared by the jobs of a process (refcounted),
//!   NVMe or UFS.
//! - [`job`]: one job's queue pair and its zero-copy DMA buffers.
//! - [`ffi`]: the `extern "C"` functions the shim calls.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod device;
pub mod ffi;
pub mod job;
pub mod spec;

/// Why the engine cannot set up or run a job; fio prints the message.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The filename or an option is wrong.
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    /// The job has no file.
    #[error("the job has no --filename (use fake, fake-ufs, or vfio-<domain>.<bus>.<dev>.<fn>)")]
    NoFile,
    /// Files of one job name different controllers.
    #[error("one job's files must be on one controller: `{first}` and `{other}` (use one job per controller)")]
    TwoControllers {
        /// The first file's controller.
        first: String,
        /// Another one.
        other: String,
    },
    /// Another job opened the controller with other engine options.
    #[error(
        "`{device}` is already open with other engine options: give every job on it the same ones"
    )]
    OptionsDiffer {
        /// The controller.
        device: String,
    },
    /// Opening the controller failed.
    #[error("cannot open `{device}`: {why}")]
    Open {
        /// The controller.
        device: String,
        /// The library's error.
        why: String,
    },
    /// A filename's selector does not fit its controller's transport.
    #[error("`{file}`: `{device}` is {want}")]
    WrongSelector {
        /// The filename.
        file: String,
        /// The controller.
        device: String,
        /// What the controller is and which selector it takes.
        want: &'static str,
    },
    /// The UFS logical unit does not exist.
    #[error("`{file}`: the UFS device has no logical unit {lun} (it has: {have:?})")]
    NoLogicalUnit {
        /// The filename.
        file: String,
        /// The LUN asked for.
        lun: u8,
        /// The LUNs the device reports.
        have: Vec<u8>,
    },
    /// The namespace does not exist.
    #[error("`{file}`: namespace {nsid} is not active (active: {have:?})")]
    NoNamespace {
        /// The filename.
        file: String,
        /// The namespace asked for.
        nsid: u32,
        /// The active ones.
        have: Vec<u32>,
    },
    /// A block size above what the controller was set up for.
    #[error("`{file}`: bs {bs} is larger than the controller's maximum transfer {max}")]
    TooLarge {
        /// The job's largest block.
        bs: u64,
        /// The controller's limit.
        max: u64,
        /// The filename.
        file: String,
    },
    /// A block size the device cannot transfer: not a whole number of its
    /// logical blocks (fio would only say err=22).
    #[error("`{file}`: bs {bs} is not a multiple of the device's {lbs}-byte logical block; use bs={lbs} or a multiple of it{hint}")]
    Unaligned {
        /// The job's block size that does not fit.
        bs: u64,
        /// The device's logical block size.
        lbs: u64,
        /// The filename.
        file: String,
        /// What else could be changed.
        hint: &'static str,
    },
    /// iodepth out of range.
    #[error("iodepth={0}: the engine supports 1 to 4096")]
    Depth(u32),
    /// iodepth deeper than the UFS queue the controller granted, for a job
    /// whose verify cannot take a busy answer.
    #[error("iodepth={iodepth} is deeper than the UFS queue pair's {depth} slots (the controller bounds queues x depth to its 256 task tags), and a mixed rw job with verify cannot be answered busy: fio re-logs a requeued write at the end of its history and then checks later blocks against the wrong seeds; lower iodepth, ask for fewer queues with qpairs, or add verify_backlog")]
    UfsDepth {
        /// fio's iodepth.
        iodepth: u32,
        /// Slots of the queue pair.
        depth: usize,
    },
    /// iodepth deeper than the NVMe/TCP target's queues (CAP.MQES), for
    /// a job whose verify cannot take a busy answer (see `UfsDepth`).
    #[error("iodepth={iodepth} is deeper than the NVMe/TCP target's {depth}-entry queues (CAP.MQES), and a mixed rw job with verify cannot be answered busy: fio re-logs a requeued write at the end of its history and then checks later blocks against the wrong seeds; lower iodepth or add verify_backlog")]
    TcpDepth {
        /// fio's iodepth.
        iodepth: u32,
        /// Slots of the queue pair.
        depth: usize,
    },
    /// No queue pair for the job.
    #[error("cannot create the job's queue pair: {why} (the controller granted {granted} I/O queue pairs; raise the qpairs option or run fewer jobs)")]
    Qpair {
        /// The library's error.
        why: String,
        /// Queue pairs granted.
        granted: usize,
    },
    /// DMA memory for fio's buffers.
    #[error("cannot allocate {len} bytes of DMA memory for fio's buffers: {why}")]
    Memory {
        /// Bytes asked for.
        len: usize,
        /// The library's error.
        why: String,
    },
    /// An I/O call before `init`.
    #[error("the job's queue pair is not set up")]
    NotInitialised,
    /// The controller failed or went away.
    #[error("controller error: {0}")]
    Controller(String),
    /// A bad argument from the C side.
    #[error("invalid argument from the fio shim: {0}")]
    Abi(&'static str),
    /// A panic inside the library (a bug), caught at the C boundary.
    #[error("internal error (panic) in {0}")]
    Panic(&'static str),
}
