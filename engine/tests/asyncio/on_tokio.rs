//! The `tokio` feature (issue 26 item 3 b): `AsyncQueue::tokio` futures
//! on a current-thread runtime, the thread sleeping in epoll on the queue
//! pair's interrupt eventfd, on the NVMe fake (an MSI-X vector per queue)
//! and the UFS MCQ fake (one INTx line shared by the queues): many I/Os
//! with their data checked, a future dropped early (its buffer stays with
//! the queue pair until the completion), a timeout, and a reset with
//! futures pending.
//!
//! Built only with `--features tokio` (`.ci/run` runs it).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::ufs::UfsQpairOptions;
use mcqio::vfio::{DmaDir, DmaSpace};
use mcqio::{
    AsyncQueue, Completion, DmaBuf, IoBuf, IoError, IoSeg, QpairOptions, SubmitError,
    TimeoutPolicy, WaitPolicy,
};
use mcqio_fixtures::testing::engine::{nvme, ufs};
use mcqio_fixtures::ufs::UfsFault;
use mcqio_fixtures::{ExecMode, Fault};
use tokio::task::LocalSet;

const HANG: Duration = Duration::from_secs(20);
const READ10: u8 = 0x28;
const WRITE10: u8 = 0x2a;

type Out<B> = Result<Completion<B>, SubmitError<B>>;

fn threaded() -> ExecMode {
    ExecMode::Threaded {
        workers: 1,
        pin_core: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn irq(depth: u16) -> QpairOptions {
    QpairOptions {
        depth,
        wait: WaitPolicy::Interrupt,
        io_timeout: None,
        ..Default::default()
    }
}

fn ok<B>(o: Out<B>) -> Completion<B> {
    let c = o.map_err(|e| e.kind).expect("submitted");
    c.result.expect("completed without error");
    c
}

fn data(i: u64, block: usize) -> Vec<u8> {
    (0..block)
        .map(|k| (i as usize * 29 + k * 5) as u8 ^ 0xa5)
        .collect()
}

/// Write `n` blocks (a task each, all at once on the `LocalSet`), then
/// read them back and check every byte.
async fn write_then_read<Q: BlockQueue<Buf = DmaBuf> + 'static>(
    aq: Rc<AsyncQueue<Q>>,
    at: Q::Addr,
    block: usize,
    n: u64,
    alloc: Rc<dyn Fn(usize) -> DmaBuf>,
) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let (aq, mut b) = (aq.clone(), alloc(block));
        b.write_at(0, &data(i, block)).unwrap();
        tasks.push(tokio::task::spawn_local(async move {
            ok(aq.write(at, i * 3, 1, b).await);
        }));
    }
    for t in tasks {
        t.await.expect("write task");
    }
    let mut tasks = Vec::new();
    for i in 0..n {
        let (aq, b) = (aq.clone(), alloc(block));
        tasks.push(tokio::task::spawn_local(async move {
            let c = ok(aq.read(at, i * 3, 1, b).await);
            let mut back = vec![0u8; block];
            c.buf.expect("handed back").read_at(0, &mut back).unwrap();
            assert_eq!(back, data(i, block), "block {i}");
        }));
    }
    for t in tasks {
        t.await.expect("read task");
    }
    assert_eq!(aq.in_flight(), 0);
}

#[test]
fn many_futures_on_nvme_sleep_on_the_queues_vector() {
    for mode in nvme::modes() {
        let (_fake, ctrl) = nvme::open(nvme::config(mode.clone(), 5));
        let rt = runtime();
        LocalSet::new().block_on(&rt, async {
            let qp = ctrl.create_qpair(irq(8)).unwrap();
            let n = 4 * qp.depth() as u64;
            let aq = Rc::new(AsyncQueue::tokio(qp).unwrap());
            let c2 = ctrl.clone();
            write_then_read(
                aq.clone(),
                1u32,
                512,
                n,
                Rc::new(move |l| nvme::buf(&c2, l)),
            )
            .await;
            let c = aq.with_queue(|q| q.counters());
            assert_eq!(c.completed, 2 * n, "{mode:?}: {c:?}");
            if mode != ExecMode::Sync {
                // The device thread completes later than the poll that
                // rang: the keeper slept and the vector woke it.
                assert!(c.interrupt_wakeups > 0, "{mode:?}: {c:?}");
            }
            Rc::try_unwrap(aq)
                .ok()
                .expect("tasks done")
                .close()
                .unwrap();
        });
    }
}

/// Counts the polls of the future it wraps.
struct Counted<F> {
    f: Pin<Box<F>>,
    polls: Rc<AtomicUsize>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.f.as_mut().poll(cx)
    }
}

#[test]
fn a_slow_command_is_awaited_asleep_not_by_spinning_the_executor() {
    // The device holds a read for 300 ms. A spinning driver would be
    // polled millions of times; a sleeping one a few times per slice
    // (10 ms) that no interrupt ends, plus the rounds of its interrupt.
    let (fake, ctrl) = nvme::open(nvme::config(threaded(), 5));
    let rt = runtime();
    rt.block_on(async {
        let qp = ctrl.create_qpair(irq(4)).unwrap();
        fake.faults().inject_next(
            Some(qp.qid()),
            None,
            Fault::Delay(Duration::from_millis(300)),
        );
        let aq = AsyncQueue::tokio(qp).unwrap();
        let polls = Rc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let f = Counted {
            f: Box::pin(aq.read(1u32, 0, 1, nvme::buf(&ctrl, 512))),
            polls: polls.clone(),
        };
        ok(f.await);
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(300));
        let slices = took.as_millis() as usize / 10 + 1;
        let polls = polls.load(Ordering::Relaxed);
        let c = aq.with_queue(|q| q.counters());
        assert!(
            polls <= 3 * slices + 8,
            "{polls} polls in {took:?}: the future spun ({c:?})"
        );
        assert!(c.interrupt_sleeps > 0, "{c:?}");
        aq.close().unwrap();
    });
}

#[test]
fn many_futures_on_two_ufs_mcq_queues_sharing_the_intx_line() {
    // 500 µs per command, so each keeper finds its queue empty and sleeps:
    // with no latency the device thread often answered before a keeper
    // looked, and one queue went through all its I/O without a sleep
    // (3 of 10 runs on a quiet machine).
    let cfg = mcqio_fixtures::ufs::UfsConfig {
        latency: Duration::from_micros(500),
        ..ufs::threaded_cfg(true, 2)
    };
    let (_f, ctrl) = ufs::up(cfg, ufs::opts(2));
    let rt = runtime();
    LocalSet::new().block_on(&rt, async {
        let opts = || UfsQpairOptions {
            wait: WaitPolicy::Interrupt,
            ..Default::default()
        };
        // Two queue pairs, one INTx notifier: each driver registers its
        // own duplicate of the eventfd with the reactor.
        let a = Rc::new(AsyncQueue::tokio(ctrl.create_qpair(opts()).unwrap()).unwrap());
        let b = Rc::new(AsyncQueue::tokio(ctrl.create_qpair(opts()).unwrap()).unwrap());
        let n = 3 * a.with_queue(|q| q.depth()) as u64;
        let alloc: Rc<dyn Fn(usize) -> DmaBuf> = {
            let c = ctrl.clone();
            Rc::new(move |l| c.alloc_buf(l, DmaDir::Bidirectional).unwrap())
        };
        // Disjoint blocks: `a` writes LBAs 3i (i < n), `b` the ones
        // from 3n + 1 on, both at once.
        let ta = tokio::task::spawn_local(write_then_read(a.clone(), 0u8, 4096, n, alloc.clone()));
        let tb = {
            let b = b.clone();
            let alloc = alloc.clone();
            tokio::task::spawn_local(async move {
                let mut tasks = Vec::new();
                for i in 0..n {
                    let (b, mut buf, back_buf) = (b.clone(), alloc(4096), alloc(4096));
                    buf.write_at(0, &data(1000 + i, 4096)).unwrap();
                    tasks.push(tokio::task::spawn_local(async move {
                        ok(b.write(0u8, 3 * n + 1 + i, 1, buf).await);
                        let c = ok(b.read(0u8, 3 * n + 1 + i, 1, back_buf).await);
                        let mut back = vec![0u8; 4096];
                        c.buf.unwrap().read_at(0, &mut back).unwrap();
                        assert_eq!(back, data(1000 + i, 4096));
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
            })
        };
        ta.await.unwrap();
        tb.await.unwrap();
        for q in [a, b] {
            let c = q.with_queue(|q| q.counters());
            assert!(c.interrupt_sleeps > 0, "{c:?}");
            Rc::try_unwrap(q).ok().unwrap().close().unwrap();
        }
    });
}

#[test]
fn a_legacy_ufs_queue_or_a_polled_one_has_no_interrupt_for_tokio() {
    let rt = runtime();
    let _g = rt.enter();
    let (_f, ctrl) = ufs::up(ufs::threaded_cfg(false, 1), ufs::opts(1));
    let qp = ctrl
        .create_qpair(UfsQpairOptions {
            wait: WaitPolicy::Interrupt,
            ..Default::default()
        })
        .unwrap();
    assert!(AsyncQueue::tokio(qp).is_err(), "legacy UFS polls");
    let (_f, ctrl) = nvme::open(nvme::config(threaded(), 5));
    let qp = ctrl.create_qpair(QpairOptions::default()).unwrap();
    assert!(
        AsyncQueue::tokio(qp).is_err(),
        "WaitPolicy::Poll routes no vector"
    );
}

/// A DMA buffer that records when it is dropped.
struct Tracked {
    buf: DmaBuf,
    dropped: Arc<Mutex<Option<Instant>>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        *self.dropped.lock().unwrap() = Some(Instant::now());
    }
}

// SAFETY: every answer is the wrapped `DmaBuf`'s, which holds the
// contract, and the `DmaBuf` lives exactly as long as the wrapper.
unsafe impl IoBuf for Tracked {
    fn segment_count(&self) -> usize {
        self.buf.segment_count()
    }
    fn segment(&self, i: usize) -> IoSeg {
        self.buf.segment(i)
    }
    fn dir(&self) -> DmaDir {
        self.buf.dir()
    }
    fn is_mapped_in(&self, space: &DmaSpace) -> bool {
        self.buf.is_mapped_in(space)
    }
}

#[test]
fn a_future_dropped_by_a_tokio_timeout_leaves_its_buffer_until_the_completion() {
    for mode in nvme::modes() {
        let (fake, ctrl) = nvme::open(nvme::config(mode.clone(), 5));
        let rt = runtime();
        rt.block_on(async {
            let qp = ctrl.create_qpair_for::<Tracked>(irq(4)).unwrap();
            let qid = qp.qid();
            let aq = AsyncQueue::tokio(qp).unwrap();
            let tracked = || {
                let dropped = Arc::new(Mutex::new(None));
                let t = Tracked {
                    buf: nvme::buf(&ctrl, 512),
                    dropped: dropped.clone(),
                };
                (t, dropped)
            };
            // The first read is held 300 ms, the second 600 ms.
            for ms in [300, 600] {
                fake.faults()
                    .inject_next(Some(qid), None, Fault::Delay(Duration::from_millis(ms)));
            }
            let (b, dropped) = tracked();
            let submitted = Instant::now();
            let r = tokio::time::timeout(Duration::from_millis(50), aq.read(1u32, 0, 1, b)).await;
            assert!(r.is_err(), "{mode:?}: the timeout dropped the future");
            assert!(
                dropped.lock().unwrap().is_none(),
                "{mode:?}: the device may still write the buffer"
            );
            assert_eq!(aq.in_flight(), 1);
            // The second future's keeper sleeps on the vector; the first
            // command's completion arrives meanwhile and only then is its
            // buffer dropped.
            let (b2, dropped2) = tracked();
            ok(aq.read(1u32, 1, 1, b2).await);
            let at = dropped
                .lock()
                .unwrap()
                .expect("released with its completion");
            assert!(
                at.duration_since(submitted) >= Duration::from_millis(300),
                "{mode:?}: dropped before the device was done"
            );
            assert!(
                dropped2.lock().unwrap().is_some(),
                "handed back and dropped"
            );
            assert_eq!(aq.in_flight(), 0);
            aq.close().unwrap();
        });
    }
}

#[test]
fn an_io_timeout_resolves_its_future_while_the_queue_sleeps() {
    // The device never completes the first read: no interrupt comes, the
    // keeper's slices keep the timeout due, the abort ends it.
    let (fake, ctrl) = nvme::open(nvme::config(threaded(), 5));
    let rt = runtime();
    LocalSet::new().block_on(&rt, async {
        let qp = ctrl
            .create_qpair(QpairOptions {
                io_timeout: Some(Duration::from_millis(200)),
                timeout_policy: TimeoutPolicy::Abort,
                ..irq(8)
            })
            .unwrap();
        fake.faults().inject_next(
            Some(qp.qid()),
            None,
            Fault::Delay(Duration::from_secs(3600)),
        );
        let aq = Rc::new(AsyncQueue::tokio(qp).unwrap());
        let tasks: Vec<_> = (0..6u64)
            .map(|i| {
                let aq = aq.clone();
                let b = nvme::buf(&ctrl, 512);
                tokio::task::spawn_local(async move {
                    let c = aq.read(1u32, i, 1, b).await.map_err(|e| e.kind).unwrap();
                    assert!(c.buf.is_some());
                    c.result
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        assert_eq!(results[0], Err(IoError::TimedOut));
        assert!(results[1..].iter().all(Result::is_ok), "{results:?}");
        Rc::try_unwrap(aq).ok().unwrap().close().unwrap();
    });

    // UFS MCQ, the same.
    let (f, ctrl) = ufs::up(ufs::threaded_cfg(true, 1), ufs::opts(1));
    LocalSet::new().block_on(&rt, async {
        let qp = ctrl
            .create_qpair_for::<DmaBuf>(UfsQpairOptions {
                io_timeout: Some(Duration::from_millis(100)),
                timeout_policy: TimeoutPolicy::Abort,
                wait: WaitPolicy::Interrupt,
                ..Default::default()
            })
            .unwrap();
        f.faults().inject_next(
            None,
            Some(READ10),
            UfsFault::Delay(Duration::from_secs(3600)),
        );
        let aq = Rc::new(AsyncQueue::tokio(qp).unwrap());
        let tasks: Vec<_> = (0..3u64)
            .map(|i| {
                let aq = aq.clone();
                let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
                tokio::task::spawn_local(async move {
                    let c = aq.read(0u8, i, 1, b).await.map_err(|e| e.kind).unwrap();
                    assert!(c.buf.is_some());
                    c.result
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        assert_eq!(results[0], Err(IoError::TimedOut));
        assert!(results[1..].iter().all(Result::is_ok), "{results:?}");
        Rc::try_unwrap(aq).ok().unwrap().close().unwrap();
    });
}

/// Yield to the runtime until `cond` holds (bounded).
async fn until(mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "condition never held");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn a_reset_with_futures_pending_resolves_each_once_and_the_queue_serves_again() {
    // NVMe: the device parks n + 1 writes; one task is aborted (its
    // future dropped, its buffer kept); the reset ends the rest once each
    // with AbortedByReset and wakes the sleeping keeper through the
    // vector.
    let (fake, ctrl) = nvme::open(nvme::config(threaded(), 5));
    let rt = runtime();
    LocalSet::new().block_on(&rt, async {
        let qp = ctrl.create_qpair(irq(8)).unwrap();
        let qid = qp.qid();
        let n = 5usize;
        for _ in 0..=n {
            fake.faults()
                .inject_next(Some(qid), None, Fault::Delay(Duration::from_secs(3600)));
        }
        let aq = Rc::new(AsyncQueue::tokio(qp).unwrap());
        let resolved = Rc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..=n as u64)
            .map(|i| {
                let (aq, resolved) = (aq.clone(), resolved.clone());
                let b = nvme::buf(&ctrl, 512);
                tokio::task::spawn_local(async move {
                    let o = aq.write(1u32, i, 1, b).await;
                    resolved.fetch_add(1, Ordering::Relaxed);
                    o
                })
            })
            .collect();
        until(|| fake.faults().pending() == 0).await;
        assert_eq!(aq.in_flight(), n + 1);
        tasks[n].abort();
        tokio::task::yield_now().await;
        assert_eq!(aq.in_flight(), n + 1, "the dropped one's buffer stays");
        let c2 = ctrl.clone();
        // From another thread, as a health monitor would.
        let reset = std::thread::spawn(move || c2.reset());
        let mut out = Vec::new();
        for t in tasks.into_iter().take(n) {
            out.push(t.await.unwrap());
        }
        reset.join().unwrap().unwrap();
        assert_eq!(resolved.load(Ordering::Relaxed), n);
        for o in out {
            let c = o.map_err(|e| e.kind).unwrap();
            assert_eq!(c.result, Err(IoError::AbortedByReset));
            assert!(c.buf.is_some());
        }
        assert_eq!(aq.in_flight(), 0, "the aborted command ended too");
        let c2 = ctrl.clone();
        write_then_read(
            aq.clone(),
            1u32,
            512,
            16,
            Rc::new(move |l| nvme::buf(&c2, l)),
        )
        .await;
        Rc::try_unwrap(aq).ok().unwrap().close().unwrap();
    });

    // UFS MCQ: the device drops the completions; the host controller
    // reset ends each future once, with its buffer.
    let (f, ctrl) = ufs::up(ufs::threaded_cfg(true, 1), ufs::opts(1));
    LocalSet::new().block_on(&rt, async {
        let qp = ctrl
            .create_qpair(UfsQpairOptions {
                wait: WaitPolicy::Interrupt,
                io_timeout: None,
                ..Default::default()
            })
            .unwrap();
        let aq = Rc::new(AsyncQueue::tokio(qp).unwrap());
        let mut tasks = Vec::new();
        for i in 0..4u64 {
            f.faults()
                .inject_next(None, Some(WRITE10), UfsFault::DropCompletion);
            let b = ufs::buf_with(&ctrl, &ufs::pattern(i, 4096));
            let aq2 = aq.clone();
            tasks.push(tokio::task::spawn_local(async move {
                aq2.write(0u8, i, 1, b).await
            }));
            // One doorbell per command, so each fault rule meets its own.
            until(|| f.faults().pending() == 0).await;
        }
        assert_eq!(aq.in_flight(), 4);
        let c2 = ctrl.clone();
        let reset = std::thread::spawn(move || c2.reset());
        for t in tasks {
            let c = t.await.unwrap().map_err(|e| e.kind).unwrap();
            assert_eq!(c.result, Err(IoError::AbortedByReset));
            assert!(c.buf.is_some());
        }
        reset.join().unwrap().unwrap();
        assert_eq!(aq.in_flight(), 0);
        let c2 = ctrl.clone();
        write_then_read(
            aq.clone(),
            0u8,
            4096,
            8,
            Rc::new(move |l| c2.alloc_buf(l, DmaDir::Bidirectional).unwrap()),
        )
        .await;
        Rc::try_unwrap(aq).ok().unwrap().close().unwrap();
    });
}

/// Issue 39 item 1 on tokio: task A polls its read until it sleeps on the
/// queue's interrupt, then awaits something else for good, keeping the
/// future alive (as a `select!` over `&mut a` whose other branch won);
/// the main task's read must still resolve once the device completed it
/// (20 ms), though A's task never polls A again. The old driver let only
/// A sleep on the interrupt, so the wake-up went to A's task alone.
#[test]
fn a_future_left_unpolled_by_its_task_does_not_stall_the_others() {
    let (_fake, ctrl) = nvme::open(mcqio_fixtures::FakeConfig {
        latency: Duration::from_millis(20),
        ..nvme::config(threaded(), 5)
    });
    let rt = runtime();
    let local = LocalSet::new();
    local.block_on(&rt, async {
        let aq = Rc::new(AsyncQueue::tokio(ctrl.create_qpair(irq(8)).unwrap()).unwrap());
        let (parked_tx, parked_rx) = tokio::sync::oneshot::channel::<()>();
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let a_task = {
            let (aq, buf) = (aq.clone(), nvme::buf(&ctrl, 512));
            tokio::task::spawn_local(async move {
                let mut a = aq.read(1u32, 0, 1, buf);
                for _ in 0..4 {
                    std::future::poll_fn(|cx| {
                        let _ = Pin::new(&mut a).poll(cx);
                        Poll::Ready(())
                    })
                    .await;
                }
                parked_tx.send(()).unwrap();
                // Alive and never polled until the end.
                let _ = end_rx.await;
                drop(a);
            })
        };
        parked_rx.await.unwrap();
        // B in a task of its own: the LocalSet polls its main future
        // whenever any of its tasks is woken, so a read awaited here would
        // be polled by A's wake-ups.
        let b = {
            let (aq, buf) = (aq.clone(), nvme::buf(&ctrl, 512));
            tokio::task::spawn_local(async move { ok(aq.read(1u32, 8, 1, buf).await).buf })
        };
        let b = tokio::time::timeout(Duration::from_secs(5), b)
            .await
            .expect("B's read completed on the device, but B was never woken while A sat unpolled");
        assert!(b.unwrap().is_some());
        end_tx.send(()).unwrap();
        a_task.await.unwrap();
        // A's command ended with its future dropped: the driver took it.
        until(|| {
            aq.drive().unwrap();
            aq.in_flight() == 0
        })
        .await;
        Rc::try_unwrap(aq).ok().unwrap().close().unwrap();
    });
}

/// Issue 39 item 7 on tokio: tasks that leave their futures alive and
/// unpolled (up to depth - 1 of them, each holding its slot), drop them
/// by a timeout mid-flight, or poll them once with a waker of another
/// context first, beside tasks that simply await theirs, on a threaded
/// device with random delays. Every plain task resolves while the others
/// sit unpolled; the abandoned ones resolve once polled again; the
/// dropped ones' commands end and their buffers go with them.
#[test]
fn futures_on_tokio_survive_tasks_that_abandon_drop_and_move_them() {
    use rand::Rng;
    for seed in 0..4u64 {
        let (fake, ctrl) = nvme::open(nvme::config(threaded(), 5));
        fake.faults()
            .set_probability(Fault::Delay(Duration::from_millis(2)), 0.3);
        let rt = runtime();
        let local = LocalSet::new();
        local.block_on(&rt, async {
            let depth = 4u16;
            let aq = Rc::new(AsyncQueue::tokio(ctrl.create_qpair(irq(depth)).unwrap()).unwrap());
            let mut rng = nvme::rng(seed);
            let (release_tx, release_rx) = tokio::sync::watch::channel(false);
            let mut plain = Vec::new();
            let mut abandoned = Vec::new();
            let mut abandons = depth - 1;
            for i in 0..32u64 {
                let (aq, mut buf) = (aq.clone(), nvme::buf(&ctrl, 512));
                buf.write_at(0, &data(i, 512)).unwrap();
                let fate = match rng.gen_range(0..4) {
                    1 if abandons > 0 => {
                        abandons -= 1;
                        1
                    }
                    1 => 0,
                    f => f,
                };
                let polls = rng.gen_range(1..=3);
                let wait_us = rng.gen_range(50..3000);
                let mut release = release_rx.clone();
                let t = tokio::task::spawn_local(async move {
                    let mut f = aq.write(1u32, i * 8, 1, buf);
                    match fate {
                        // Polled a few times, then left alone until the end.
                        1 => {
                            let mut out = None;
                            for _ in 0..polls {
                                out = std::future::poll_fn(|cx| {
                                    Poll::Ready(match Pin::new(&mut f).poll(cx) {
                                        Poll::Ready(o) => Some(o),
                                        Poll::Pending => None,
                                    })
                                })
                                .await;
                                if out.is_some() {
                                    break;
                                }
                                tokio::task::yield_now().await;
                            }
                            while !*release.borrow() {
                                release.changed().await.unwrap();
                            }
                            ok(match out {
                                Some(o) => o,
                                None => f.await,
                            });
                        }
                        // Dropped by a timeout, maybe mid-flight.
                        2 => {
                            let r =
                                tokio::time::timeout(Duration::from_micros(wait_us), &mut f).await;
                            if let Ok(o) = r {
                                ok(o);
                            }
                        }
                        // First polled through a waker that never wakes this task.
                        3 => {
                            let noop = std::task::Waker::noop();
                            match Pin::new(&mut f).poll(&mut Context::from_waker(noop)) {
                                Poll::Ready(o) => ok(o),
                                Poll::Pending => ok(f.await),
                            };
                        }
                        _ => {
                            ok(f.await);
                        }
                    }
                });
                if fate == 1 {
                    abandoned.push(t);
                } else {
                    plain.push(t);
                }
            }
            tokio::time::timeout(HANG, async {
                for t in plain {
                    t.await.expect("task");
                }
            })
            .await
            .expect("a future stalled while others sat unpolled");
            release_tx.send(true).unwrap();
            tokio::time::timeout(HANG, async {
                for t in abandoned {
                    t.await.expect("task");
                }
            })
            .await
            .expect("an abandoned future did not resolve once polled again");
            until(|| {
                aq.drive().unwrap();
                aq.in_flight() == 0
            })
            .await;
            Rc::try_unwrap(aq).ok().unwrap().close().unwrap();
        });
        assert_eq!(fake.stats().iommu_faults, 0);
        assert!(fake.iommu().mapped_but_freed().is_empty());
    }
}
