//! Why a run could not happen: the one error type of the run, its
//! planning and the targets.

use crate::spec::SpecError;
use crate::uring::UringError;

/// Why a run could not happen.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// A bad spec or value.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// An option combination that cannot work.
    #[error("{0}")]
    Usage(String),
    /// io_uring set-up failed.
    #[error(transparent)]
    Uring(#[from] UringError),
    /// The device could not be opened.
    #[error("{0}")]
    Device(String),
    /// The device offers fewer I/O queue pairs than the run has jobs (each
    /// job owns one; queues are never shared).
    #[error("{device}: {jobs} job(s) need {jobs} I/O queue pairs but the controller offers {granted}; use -j {granted}{hint}",
        hint = if device.starts_with("fake") { " or fake,qpairs=N" } else { "" })]
    QueueCount {
        /// The device label.
        device: String,
        /// Jobs asked for.
        jobs: usize,
        /// Queue pairs offered or granted.
        granted: usize,
    },
    /// `--offset`/`--size` do not fit a namespace or are not block-aligned.
    #[error("{device} namespace {nsid}: the region at offset {offset} {size} {why} (the namespace has {ns_bytes} bytes in {lbads}-byte blocks)",
        size = size.map_or_else(|| "(to the end)".to_string(), |s| format!("of {s} bytes")))]
    Region {
        /// The device label.
        device: String,
        /// The namespace.
        nsid: u32,
        /// `--offset`, bytes.
        offset: u64,
        /// `--size`, bytes.
        size: Option<u64>,
        /// Namespace size, bytes.
        ns_bytes: u64,
        /// Logical block size.
        lbads: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// `-N` names a namespace the device does not have.
    #[error("{device} has no namespace {nsid} (it has {have})")]
    NoNamespace {
        /// The device label.
        device: String,
        /// The namespace asked for.
        nsid: u32,
        /// The namespaces it has.
        have: String,
    },
    /// The report or chart could not be written.
    #[error("cannot write {}: {msg}", path.display())]
    Output {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        msg: String,
    },
    /// A job failed to start or its queue broke.
    #[error("job {job}: {msg}")]
    Job {
        /// Job number.
        job: usize,
        /// What went wrong.
        msg: String,
    },
}
