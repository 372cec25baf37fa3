//! An MSI-X vector per I/O queue, for queue pairs that wait on interrupts
//! ([`crate::WaitPolicy`]).
//!
//! The first such queue pair routes the controller's vectors: one
//! [`Notifier`] per vector, `min(table size, granted I/O queues + 1)` of
//! them, through [`mcqio_vfio::Backend::interrupts`], once (VFIO fixes the
//! vector count when it enables MSI-X, and re-routing would disable
//! delivery to queues already waiting). The admin queue keeps vector 0
//! (it always interrupts there; nobody waits on it). I/O queue `qid` gets
//! vector `qid` while there are enough; beyond, queues share vectors
//! `1..n` round robin and their waits sleep in short slices (see
//! `core::qpair::wait`). A controller whose table has a single vector puts
//! its I/O queues on vector 0 with the admin queue, shared as well.
//!
//! Queue pairs with [`WaitPolicy::Poll`](crate::WaitPolicy::Poll) create
//! their CQ with IEN clear and route nothing: a polled run never takes an
//! interrupt.

use std::sync::Arc;

use mcqio_vfio::{IrqKind, Notifier};

use crate::core::error::{Error, Result};
use crate::nvme::pcie::controller::Controller;

/// Where an I/O queue interrupts.
#[derive(Clone, Debug)]
pub(crate) struct QueueIrq {
    /// The MSI-X vector (Create I/O CQ's IV).
    pub vector: u16,
    /// Its notifier.
    pub notifier: Arc<Notifier>,
    /// Other queues (or the admin queue) interrupt on it too.
    pub shared: bool,
}

impl Controller {
    /// The vector and notifier of I/O queue `qid`, routing the controller's
    /// vectors the first time (see the module docs).
    pub(crate) fn queue_irq(&self, qid: u16) -> Result<QueueIrq> {
        let no = |why: String| Error::InvalidOption(format!("waiting on interrupts: {why}"));
        let mut routed = self.link.irqs.lock().unwrap_or_else(|p| p.into_inner());
        let notifiers = match &*routed {
            Some(n) => Arc::clone(n),
            None => {
                let irqs =
                    self.link.backend.interrupts().ok_or_else(|| {
                        no(format!("{} has no interrupts", self.link.backend.name()))
                    })?;
                let vectors = match irqs.kind() {
                    IrqKind::MsiX { vectors } | IrqKind::Msi { vectors } if vectors > 0 => vectors,
                    k => {
                        return Err(no(format!(
                            "{} offers {k:?}; an NVMe queue needs MSI-X or MSI",
                            self.link.backend.name()
                        )))
                    }
                };
                let n = vectors.min(u32::from(self.qids.granted()) + 1) as usize;
                let n: Arc<[Arc<Notifier>]> = (0..n)
                    .map(|_| Notifier::new().map(Arc::new))
                    .collect::<std::io::Result<Vec<_>>>()
                    .map_err(|e| no(format!("eventfd: {e}")))?
                    .into();
                irqs.route(&n).map_err(|e| no(e.to_string()))?;
                log::info!(
                    "{}: {} interrupt vectors routed for waiting queue pairs",
                    self.link.backend.name(),
                    n.len()
                );
                *routed = Some(Arc::clone(&n));
                n
            }
        };
        let (vector, shared) = vector_of(qid, notifiers.len(), self.qids.granted());
        Ok(QueueIrq {
            vector,
            notifier: Arc::clone(&notifiers[usize::from(vector)]),
            shared,
        })
    }
}

impl Controller {
    /// The controller was reset or failed: wake every queue pair asleep on
    /// a vector, so its wait sees the new state at once (its next poll
    /// recovers) instead of at the end of its slice.
    #[cold]
    pub(crate) fn wake_waiters(&self) {
        let routed = self.link.irqs.lock().unwrap_or_else(|p| p.into_inner());
        for n in routed.iter().flat_map(|n| n.iter()) {
            n.signal();
        }
    }
}

/// The vector of I/O queue `qid` among `n` routed vectors (vector 0 the
/// admin queue's) on a controller granting `granted` I/O queues, and
/// whether it is shared.
fn vector_of(qid: u16, n: usize, granted: u16) -> (u16, bool) {
    let shared = usize::from(granted) + 1 > n;
    match n {
        0 | 1 => (0, true),
        _ if usize::from(qid) < n => (qid, shared),
        _ => (1 + ((qid - 1) % (n as u16 - 1)), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_queue_has_its_vector_while_there_are_enough() {
        // 65 vectors (QEMU's default), 64 queues: one each, none shared.
        for q in 1..=64 {
            assert_eq!(vector_of(q, 65, 64), (q, false));
        }
        // 5 vectors for 8 queues: 1..=4, then round robin, all shared.
        let v: Vec<u16> = (1..=8).map(|q| vector_of(q, 5, 8).0).collect();
        assert_eq!(v, [1, 2, 3, 4, 1, 2, 3, 4]);
        assert!(vector_of(1, 5, 8).1);
        // A single vector: with the admin queue, shared.
        assert_eq!(vector_of(3, 1, 4), (0, true));
    }
}
