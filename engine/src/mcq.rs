//! One queue pair per core: the MCQ model.
//!
//! [`run_per_core`] creates `threads` queue pairs up front, then runs the
//! closure once per queue pair on its own thread, pinned to core
//! `i % cores`. Queues are never shared: asking for more threads than the
//! controller granted I/O queues fails with [`Error::NotEnoughQueues`]
//! before any thread starts, and if some granted queues are already in use
//! by other queue pairs, with [`Error::NoFreeQueue`].

use std::sync::Arc;

use crate::ctrl::Controller;
use crate::io::DmaBuf;
use crate::queue::{QpairOptions, QueuePair};
use crate::{Error, Result};

/// Run `f(index, &mut queue_pair)` on `threads` pinned threads, one queue
/// pair each, and return the results in index order.
pub fn run_per_core<R, F>(
    ctrl: &Arc<Controller>,
    threads: usize,
    opts: QpairOptions,
    f: F,
) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(usize, &mut QueuePair<DmaBuf>) -> R + Sync,
{
    let granted = ctrl.granted_io_queues();
    if threads > granted {
        return Err(Error::NotEnoughQueues {
            requested: threads,
            granted,
        });
    }
    let mut qps = Vec::with_capacity(threads);
    for _ in 0..threads {
        qps.push(ctrl.create_qpair(opts.clone())?);
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
