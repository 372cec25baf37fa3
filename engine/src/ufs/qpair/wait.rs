//! Waiting on the host controller's interrupt: [`UfsQueuePair::wait`]
//! (the order that loses no wake-up is `core::qpair::wait`'s; the
//! acknowledgement and unmask are `ctrl/irq.rs`'s).

use super::UfsQueuePair;
use crate::core::error::Result;
use crate::core::io::{Completion, IoBuf};
use crate::core::qpair::Lifecycle;
use std::time::Duration;

impl<B: IoBuf> UfsQueuePair<B> {
    /// Poll until something completes or `timeout` passes (`None`: no
    /// limit), as [`UfsQpairOptions::wait`](crate::ufs::UfsQpairOptions::wait) says, like NVMe's
    /// [`crate::QueuePair::wait`]. Completions reach `f` through
    /// [`poll`](Self::poll), at most `max`; returns how many (0: the
    /// timeout passed, or nothing is outstanding; `max` = 0 is refused with
    /// [`Error::InvalidOption`](crate::core::error::Error::InvalidOption)). The line is shared by
    /// every waiting queue pair of the controller, so a sleep lasts at
    /// most 1 ms before the queue polls again. MCQ only: a legacy queue
    /// pair polls.
    pub fn wait<F: FnMut(Completion<B>)>(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        mut f: F,
    ) -> Result<usize> {
        Lifecycle::wait(self, max, timeout, &mut f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::qpair::WaitPolicy;
    use crate::ufs::qpair::Arc;
    use crate::ufs::UfsController;
    use crate::ufs::UfsOptions;
    use crate::ufs::UfsQpairOptions;
    use mcqio_fixtures::ufs::{FakeUfs, UfsConfig};
    use mcqio_fixtures::ExecMode;
    use mcqio_vfio::DmaDir;

    fn setup(mcq: bool) -> (Arc<FakeUfs>, Arc<UfsController>) {
        let fake = FakeUfs::new(UfsConfig {
            exec: ExecMode::Threaded {
                workers: 1,
                pin_core: None,
            },
            mcq,
            ..UfsConfig::default()
        })
        .expect("fake");
        let backend: Arc<dyn mcqio_vfio::Backend> = fake.clone();
        let ctrl = UfsController::new(
            backend,
            UfsOptions {
                queues: 2,
                depth: 8,
                ..UfsOptions::default()
            },
        )
        .expect("bring-up");
        (fake, ctrl)
    }

    fn qpair(ctrl: &Arc<UfsController>, wait: WaitPolicy) -> UfsQueuePair {
        ctrl.create_qpair(UfsQpairOptions {
            wait,
            ..UfsQpairOptions::default()
        })
        .expect("qpair")
    }

    /// Many reads, each waited for on the INTx line while the device thread
    /// completes it. The slice that bounds a sleep on a shared line is made
    /// longer than the wait's limit, so only the line ends a sleep: an
    /// acknowledgement or unmask in the wrong order (or none) hangs a wait.
    #[test]
    fn waits_sleep_on_intx_and_lose_no_wake_up() {
        {
            let mcq = true;
            let (fake, ctrl) = setup(mcq);
            let lun = ctrl.logical_units()[0].lun;
            let mut q = qpair(&ctrl, WaitPolicy::Interrupt);
            q.eng.wait.slice = Duration::from_secs(60);
            let mut buf = Some(ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap());
            for i in 0..1000u64 {
                q.read(lun, i % 64, 1, buf.take().unwrap(), i)
                    .expect("read");
                q.submit();
                let n = q
                    .wait(1, Some(Duration::from_secs(20)), |c| {
                        assert!(c.result.is_ok(), "{:?}", c.result);
                        buf = c.buf;
                    })
                    .expect("wait");
                assert_eq!(n, 1, "mcq {mcq}, I/O {i}: the wait ran out its 20 s");
                let c = q.counters();
                assert_eq!(
                    c.interrupt_sleeps, c.interrupt_wakeups,
                    "I/O {i}: a sleep ran out its 20 s (a lost wake-up)"
                );
            }
            let c = q.counters();
            assert!(c.interrupt_sleeps > 0, "mcq {mcq}: the waits slept");
            assert_eq!(
                c.interrupt_sleeps, c.interrupt_wakeups,
                "mcq {mcq}: every sleep ended by the line"
            );
            // (Counted just after the signal: the last may not be yet.)
            assert!(fake.interrupts_raised() + 1 >= c.interrupt_wakeups);
        }
    }

    /// Legacy mode's UTRDs ask for no interrupt: its waits poll.
    #[test]
    fn a_legacy_queue_waits_by_polling() {
        let (fake, ctrl) = setup(false);
        let lun = ctrl.logical_units()[0].lun;
        let mut q = qpair(&ctrl, WaitPolicy::Interrupt);
        let buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        q.read(lun, 0, 1, buf, 1).expect("read");
        q.submit();
        assert_eq!(q.wait(1, Some(Duration::from_secs(20)), |_| {}).unwrap(), 1);
        assert_eq!(q.counters().interrupt_sleeps, 0);
        assert_eq!(fake.interrupts_raised(), 0);
    }

    #[test]
    fn a_polled_ufs_queue_routes_no_interrupt() {
        let (fake, ctrl) = setup(true);
        let lun = ctrl.logical_units()[0].lun;
        let mut q = qpair(&ctrl, WaitPolicy::Poll);
        let buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        q.read(lun, 0, 1, buf, 1).expect("read");
        q.submit();
        assert_eq!(q.wait(1, Some(Duration::from_secs(20)), |_| {}).unwrap(), 1);
        assert_eq!(fake.interrupts_raised(), 0);
        assert_eq!(q.counters().interrupt_sleeps, 0);
    }
}
