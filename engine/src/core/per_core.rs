//! One queue pair per core: the MCQ model, for every wire.
//!
//! [`run_per_core`] creates `threads` queue pairs up front, then runs the
//! closure once per queue pair on its own thread, pinned to core
//! `i % cores`. Queues are never shared: asking for more threads than the
//! controller granted I/O queues fails with [`Error::NotEnoughQueues`]
//! before any thread starts, and if some granted queues are already in use
//! by other queue pairs, with [`Error::NoFreeQueue`]. Any controller that
//! hands out queue pairs ([`PerCore`]: NVMe's
//! [`Controller`](crate::Controller), UFS's
//! [`UfsController`](crate::UfsController), each implementing it in its
//! own module) works.

use super::error::{Error, Result};

/// A controller that hands out one queue pair per thread.
pub trait PerCore {
    /// The queue pair (of [`DmaBuf`](super::io::DmaBuf)s) it creates.
    type Qpair: Send;
    /// Options for each queue pair.
    type Options: Clone;
    /// How many queue pairs it granted (at most one per thread).
    fn granted_queues(&self) -> usize;
    /// Create one queue pair.
    fn create_for_core(&self, opts: &Self::Options) -> Result<Self::Qpair>;
}

/// Run `f(index, &mut queue_pair)` on `threads` pinned threads, one queue
/// pair each, and return the results in index order.
///
/// The closure's result is any `Send` type, so it may be a
/// `Result<T, Box<dyn std::error::Error + Send + Sync>>` that mixes error
/// types through `?` (the engine's [`Error`], a
/// [`SubmitError`](super::io::SubmitError), a message); [`Error`] boxes
/// into the same type, so one `?` takes the outer result too
/// (`engine/tests/wire_neutral/api.rs` shows it).
///
/// ```
/// use std::sync::Arc;
/// use mcqio::{run_per_core, Controller, ControllerOptions, QpairOptions, vfio::Backend};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend: Arc<dyn Backend> = mcqio_fixtures::FakeController::new(Default::default())?;
/// let ctrl = Controller::new(backend, ControllerOptions::default())?;
/// let lba = ctrl.namespace(1).ok_or("no namespace 1")?.lba_size as usize;
/// // Two threads, each writing and reading back its own block.
/// let results = run_per_core(&ctrl, 2, QpairOptions::default(), |i, qp| {
///     let data = vec![i as u8 + 1; lba];
///     qp.write_blocking(1, i as u64, &data)?;
///     let mut back = vec![0; lba];
///     qp.read_blocking(1, i as u64, &mut back)?;
///     Ok::<bool, mcqio::Error>(back == data)
/// })?;
/// for r in results {
///     assert!(r?);
/// }
/// // More threads than granted queues is refused up front.
/// let too_many = ctrl.granted_io_queues() + 1;
/// assert!(matches!(
///     run_per_core(&ctrl, too_many, QpairOptions::default(), |_, _| ()),
///     Err(mcqio::Error::NotEnoughQueues { .. })
/// ));
/// # Ok(())
/// # }
/// ```
pub fn run_per_core<C, R, F>(ctrl: &C, threads: usize, opts: C::Options, f: F) -> Result<Vec<R>>
where
    C: PerCore,
    R: Send,
    F: Fn(usize, &mut C::Qpair) -> R + Sync,
{
    let granted = ctrl.granted_queues();
    if threads > granted {
        return Err(Error::NotEnoughQueues {
            requested: threads,
            granted,
        });
    }
    let mut qps = Vec::with_capacity(threads);
    for _ in 0..threads {
        qps.push(ctrl.create_for_core(&opts)?);
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = qps
            .into_iter()
            .enumerate()
            .map(|(i, mut qp)| {
                let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
                s.spawn(move || {
                    if let Some(c) = core {
                        core_affinity::set_for_current(c);
                    }
                    f(i, &mut qp)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| h.join().map_err(|_| Error::WorkerPanicked(i)))
            .collect()
    })
}
