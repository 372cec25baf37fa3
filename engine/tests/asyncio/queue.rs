//! The executor-agnostic async driver (issue 26 item 3 a): futures over
//! NVMe and UFS queue pairs on the fakes, run by a minimal executor written
//! here (std only): many at once, more than the queue holds, dropped
//! early, timed out, and pending through a controller reset.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::ufs::UfsQpairOptions;
use mcqio::vfio::DmaDir;
use mcqio::{
    AsyncQueue, Completion, DmaBuf, IoError, QpairOptions, SubmitError, SubmitErrorKind,
    TimeoutPolicy,
};
use mcqio_fixtures::testing::engine::asyncio::{Flag, Tracked};
use mcqio_fixtures::testing::engine::{nvme, ufs};
use mcqio_fixtures::ufs::UfsFault;
use mcqio_fixtures::{ExecMode, Fault};

const HANG: Duration = Duration::from_secs(20);

type Out<B> = Result<Completion<B>, SubmitError<B>>;
type Task<'a, B> = Pin<Box<dyn Future<Output = Out<B>> + 'a>>;

/// The minimal executor: polls every woken task until all resolved.
/// Returns the outputs in task order and the rounds it took.
fn run_all<B>(tasks: Vec<Task<'_, B>>) -> (Vec<Out<B>>, usize) {
    run_all_with(tasks, || {})
}

/// [`run_all`], calling `tick` every round: a sync fake's time is driven
/// so (`FakeController::poll`). Alone, a delayed completion reaches the
/// CQ only when the queue pair touches the device, in its health check
/// every few thousand empty polls — which a loaded machine's `yield_now`
/// can stretch past [`HANG`] (seen: a 300 ms delay not posted in 20 s).
fn run_all_with<B>(tasks: Vec<Task<'_, B>>, tick: impl Fn()) -> (Vec<Out<B>>, usize) {
    let flags: Vec<Arc<Flag>> = tasks
        .iter()
        .map(|_| Arc::new(Flag(AtomicBool::new(true))))
        .collect();
    let wakers: Vec<Waker> = flags.iter().map(|f| Waker::from(f.clone())).collect();
    let mut tasks: Vec<Option<Task<'_, B>>> = tasks.into_iter().map(Some).collect();
    let mut out: Vec<Option<Out<B>>> = tasks.iter().map(|_| None).collect();
    let start = Instant::now();
    let mut rounds = 0;
    while out.iter().any(Option::is_none) {
        tick();
        rounds += 1;
        let mut any = false;
        for i in 0..tasks.len() {
            if !flags[i].0.swap(false, Ordering::AcqRel) {
                continue;
            }
            let Some(t) = tasks[i].as_mut() else {
                continue;
            };
            any = true;
            if let Poll::Ready(o) = t.as_mut().poll(&mut Context::from_waker(&wakers[i])) {
                out[i] = Some(o);
                tasks[i] = None;
            }
        }
        assert!(
            any || out.iter().all(Option::is_some),
            "no task woken with {} unresolved: a lost wake-up",
            out.iter().filter(|o| o.is_none()).count()
        );
        assert!(start.elapsed() < HANG, "futures did not resolve");
        std::thread::yield_now();
    }
    (out.into_iter().map(Option::unwrap).collect(), rounds)
}

fn ok<B>(o: Out<B>) -> Completion<B> {
    let c = o.map_err(|e| e.kind).expect("submitted");
    c.result.expect("completed without error");
    c
}

/// Write `n` blocks (one per future, distinct patterns) and read them
/// back, all futures at once on one driver; returns the reads' bytes.
fn write_then_read<Q: BlockQueue<Buf = DmaBuf>>(
    aq: &AsyncQueue<Q>,
    at: Q::Addr,
    block: usize,
    n: u64,
    alloc: &dyn Fn(usize) -> DmaBuf,
) {
    let data = |i: u64| -> Vec<u8> {
        (0..block)
            .map(|k| (i as usize * 31 + k * 7) as u8 ^ 0x5a)
            .collect()
    };
    let writes: Vec<Task<'_, DmaBuf>> = (0..n)
        .map(|i| {
            let mut b = alloc(block);
            b.write_at(0, &data(i)).unwrap();
            Box::pin(aq.write(at, i * 3, 1, b)) as Task<'_, DmaBuf>
        })
        .collect();
    for o in run_all(writes).0 {
        ok(o);
    }
    let reads: Vec<Task<'_, DmaBuf>> = (0..n)
        .map(|i| Box::pin(aq.read(at, i * 3, 1, alloc(block))) as Task<'_, DmaBuf>)
        .collect();
    for (i, o) in run_all(reads).0.into_iter().enumerate() {
        let c = ok(o);
        let mut back = vec![0u8; block];
        c.buf
            .expect("the buffer comes back")
            .read_at(0, &mut back)
            .unwrap();
        assert_eq!(back, data(i as u64), "block {i}");
    }
    assert_eq!(aq.in_flight(), 0);
}

#[test]
fn many_futures_on_nvme_more_than_the_queue_holds() {
    for mode in nvme::modes() {
        let (_fake, ctrl) = nvme::open(nvme::config(mode.clone(), 5));
        let qp = ctrl
            .create_qpair(QpairOptions {
                depth: 8,
                ..Default::default()
            })
            .unwrap();
        let depth = qp.depth();
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        // Four times the queue's depth: futures wait for slots (queue
        // full is Pending, never an error).
        let n = 4 * depth as u64;
        write_then_read(&aq, 1u32, 512, n, &|l| nvme::buf(&ctrl, l));
        let c = aq.with_queue(|q| q.counters());
        assert!(c.submitted >= 2 * n, "{mode:?}: {c:?}");
        aq.close().unwrap();
    }
}

#[test]
fn many_futures_on_ufs_mcq_and_legacy_sync_and_threaded() {
    for cfg in [
        ufs::sync_cfg(true),
        ufs::sync_cfg(false),
        ufs::threaded_cfg(true, 2),
        ufs::threaded_cfg(false, 1),
    ] {
        let (_f, ctrl) = ufs::up(cfg, ufs::opts(1));
        let qp = ctrl.create_qpair(Default::default()).unwrap();
        let n = 3 * qp.depth() as u64;
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        write_then_read(&aq, 0u8, 4096, n, &|l| {
            ctrl.alloc_buf(l, DmaDir::Bidirectional).unwrap()
        });
        aq.close().unwrap();
    }
}

#[test]
fn caller_driven_futures_complete_through_wait() {
    let (_f, ctrl) = ufs::up(ufs::threaded_cfg(true, 1), ufs::opts(1));
    let aq = AsyncQueue::caller_driven(ctrl.create_qpair(Default::default()).unwrap())
        .expect("an idle queue pair");
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut f = aq.read(
        0u8,
        5,
        1,
        ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
    );
    assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
    // Caller-driven: the future does not wake itself to keep polling.
    assert!(!flag.0.load(Ordering::Acquire));
    let start = Instant::now();
    while !flag.0.swap(false, Ordering::AcqRel) {
        aq.wait(Some(Duration::from_millis(50))).unwrap();
        assert!(start.elapsed() < HANG);
    }
    // Woken only once the completion was recorded: ready at once.
    match Pin::new(&mut f).poll(&mut cx) {
        Poll::Ready(o) => assert!(ok(o).buf.is_some()),
        Poll::Pending => panic!("woken before its completion was recorded"),
    }
    drop(f);
    aq.close().unwrap();
}

#[test]
fn bad_input_resolves_once_with_the_buffer() {
    let (_fake, ctrl) = nvme::open(nvme::config(ExecMode::Sync, 5));
    let aq = AsyncQueue::new(ctrl.create_qpair(Default::default()).unwrap())
        .expect("an idle queue pair");
    let tasks: Vec<Task<'_, DmaBuf>> = vec![
        Box::pin(aq.read(1u32, u64::MAX - 1, 1, nvme::buf(&ctrl, 512))),
        Box::pin(aq.read(9u32, 0, 1, nvme::buf(&ctrl, 512))),
        Box::pin(aq.write(1u32, 0, 0, nvme::buf(&ctrl, 512))),
        Box::pin(aq.read(1u32, 0, 1, nvme::buf(&ctrl, 512))),
    ];
    let out = run_all(tasks).0;
    let kinds: Vec<_> = out
        .into_iter()
        .map(|o| o.map(|c| c.result).map_err(|e| e.kind))
        .collect();
    assert!(
        matches!(kinds[0], Err(SubmitErrorKind::LbaOutOfRange { .. })),
        "{kinds:?}"
    );
    assert!(
        matches!(kinds[1], Err(SubmitErrorKind::UnknownNamespace { nsid: 9 })),
        "{kinds:?}"
    );
    assert!(
        matches!(kinds[2], Err(SubmitErrorKind::ZeroLength)),
        "{kinds:?}"
    );
    assert_eq!(kinds[3], Ok(Ok(())));
    assert_eq!(aq.in_flight(), 0);
    aq.close().unwrap();
}

#[test]
fn a_future_dropped_early_leaves_its_buffer_with_the_queue_until_the_completion() {
    for mode in nvme::modes() {
        let (fake, ctrl) = nvme::open(nvme::config(mode.clone(), 5));
        let qp = ctrl
            .create_qpair_for::<Tracked>(QpairOptions {
                depth: 4,
                ..Default::default()
            })
            .unwrap();
        let qid = qp.qid();
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let tracked = |b: u8| {
            let mut buf = nvme::buf(&ctrl, 512);
            buf.fill(b);
            let dropped = Arc::new(AtomicBool::new(false));
            (
                Tracked {
                    buf,
                    id: 0,
                    dropped: dropped.clone(),
                },
                dropped,
            )
        };

        // Held by the device for 300 ms.
        fake.faults()
            .inject_next(Some(qid), None, Fault::Delay(Duration::from_millis(300)));
        let (b, dropped) = tracked(1);
        let mut f = aq.read(1u32, 0, 1, b);
        let submitted = Instant::now();
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending()); // queued
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending()); // rung
        drop(f);
        assert!(
            !dropped.load(Ordering::Acquire),
            "{mode:?}: the device may still write the buffer"
        );
        assert_eq!(aq.in_flight(), 1);
        let start = Instant::now();
        while aq.in_flight() > 0 {
            assert!(!dropped.load(Ordering::Acquire), "{mode:?}: dropped early");
            fake.poll();
            aq.drive().unwrap();
            assert!(start.elapsed() < HANG);
            std::thread::yield_now();
        }
        assert!(
            submitted.elapsed() >= Duration::from_millis(300),
            "{mode:?}"
        );
        assert!(
            dropped.load(Ordering::Acquire),
            "{mode:?}: released with the completion"
        );

        // Completed, recorded, then dropped before being polled: the
        // buffer goes at once (the device is done with it).
        let (b, dropped) = tracked(2);
        let mut f = aq.write(1u32, 8, 1, b);
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        let start = Instant::now();
        while aq.in_flight() > 0 {
            fake.poll();
            aq.drive().unwrap();
            assert!(start.elapsed() < HANG);
            std::thread::yield_now();
        }
        assert!(!dropped.load(Ordering::Acquire));
        drop(f);
        assert!(dropped.load(Ordering::Acquire));

        // Every slot serves again.
        let tasks: Vec<Task<'_, Tracked>> = (0..12)
            .map(|i| Box::pin(aq.read(1u32, i, 1, tracked(0).0)) as Task<'_, Tracked>)
            .collect();
        for o in run_all(tasks).0 {
            ok(o);
        }
        aq.close().unwrap();
    }
}

/// A future whose command ends while another polls the queue resolves
/// without polling the queue itself; the commands still in flight must
/// keep being polled (the old driver's hand-over of its one "keeper"
/// needed a test of its own for this). Two reads ending after 50 ms and a
/// write ending after 300 ms, in both slot orders.
#[test]
fn futures_that_resolve_without_polling_the_queue_leave_the_others_polled() {
    for write_second in [false, true] {
        let (fake, ctrl) = nvme::open(nvme::config(ExecMode::Sync, 5));
        let qp = ctrl
            .create_qpair(QpairOptions {
                depth: 4,
                ..Default::default()
            })
            .unwrap();
        let qid = qp.qid();
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        for (opcode, ms) in [(0x02u8, 50u64), (0x02, 50), (0x01, 300)] {
            fake.faults().inject_next(
                Some(qid),
                Some(opcode),
                Fault::Delay(Duration::from_millis(ms)),
            );
        }
        let read = |lba| Box::pin(aq.read(1u32, lba, 1, nvme::buf(&ctrl, 512))) as Task<'_, DmaBuf>;
        let write = Box::pin(aq.write(1u32, 64, 1, nvme::buf(&ctrl, 512))) as Task<'_, DmaBuf>;
        let tasks = if write_second {
            vec![read(0), write, read(8)]
        } else {
            vec![read(0), read(8), write]
        };
        for o in run_all_with(tasks, || fake.poll()).0 {
            ok(o);
        }
        aq.close().unwrap();
    }
}

#[test]
fn a_timeout_resolves_its_future_with_timed_out_and_the_buffer() {
    for mode in nvme::modes() {
        let (fake, ctrl) = nvme::open(nvme::config(mode.clone(), 5));
        let qp = ctrl
            .create_qpair(QpairOptions {
                depth: 8,
                io_timeout: Some(Duration::from_millis(200)),
                timeout_policy: TimeoutPolicy::Abort,
                ..Default::default()
            })
            .unwrap();
        fake.faults().inject_next(
            Some(qp.qid()),
            None,
            Fault::Delay(Duration::from_secs(3600)),
        );
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        let tasks: Vec<Task<'_, DmaBuf>> = (0..6)
            .map(|i| Box::pin(aq.read(1u32, i, 1, nvme::buf(&ctrl, 512))) as Task<'_, DmaBuf>)
            .collect();
        let out = run_all(tasks).0;
        let results: Vec<_> = out
            .into_iter()
            .map(|o| {
                let c = o.map_err(|e| e.kind).unwrap();
                assert!(c.buf.is_some(), "{mode:?}");
                c.result
            })
            .collect();
        assert_eq!(results[0], Err(IoError::TimedOut), "{mode:?}");
        assert!(
            results[1..].iter().all(Result::is_ok),
            "{mode:?}: {results:?}"
        );
        aq.close().unwrap();
    }
}

#[test]
fn a_reset_resolves_every_pending_future_once_with_aborted_by_reset() {
    for mode in nvme::modes() {
        let (fake, ctrl) = nvme::open(nvme::config(mode.clone(), 5));
        let qp = ctrl
            .create_qpair(QpairOptions {
                depth: 8,
                io_timeout: None,
                ..Default::default()
            })
            .unwrap();
        let qid = qp.qid();
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        let n = 5;
        // One more, whose future is dropped while the device holds it.
        for _ in 0..=n {
            fake.faults()
                .inject_next(Some(qid), None, Fault::Delay(Duration::from_secs(3600)));
        }
        let resolved = AtomicUsize::new(0);
        let tasks: Vec<Task<'_, DmaBuf>> = (0..=n as u64)
            .map(|i| {
                let f = aq.write(1u32, i, 1, nvme::buf(&ctrl, 512));
                let resolved = &resolved;
                Box::pin(async move {
                    let o = f.await;
                    resolved.fetch_add(1, Ordering::Relaxed);
                    o
                }) as Task<'_, DmaBuf>
            })
            .collect();
        // Run the executor by hand: submit and ring, let the device park
        // them, reset, then run until every future resolved.
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut tasks: Vec<Option<Task<'_, DmaBuf>>> = tasks.into_iter().map(Some).collect();
        for _ in 0..2 {
            for t in tasks.iter_mut().flatten() {
                assert!(t.as_mut().poll(&mut cx).is_pending());
            }
        }
        let start = Instant::now();
        while fake.faults().pending() > 0 {
            aq.drive().unwrap();
            assert!(start.elapsed() < HANG);
            std::thread::yield_now();
        }
        assert_eq!(aq.in_flight(), n + 1);
        tasks[n] = None;
        assert_eq!(aq.in_flight(), n + 1, "the dropped one's buffer stays");
        ctrl.reset().unwrap();
        let mut out = Vec::new();
        while out.len() < n {
            for t in tasks.iter_mut() {
                if let Some(f) = t {
                    if let Poll::Ready(o) = f.as_mut().poll(&mut cx) {
                        out.push(o);
                        *t = None;
                    }
                }
            }
            assert!(start.elapsed() < HANG);
        }
        drop(tasks);
        assert_eq!(resolved.load(Ordering::Relaxed), n, "{mode:?}");
        for o in out {
            let c = o.map_err(|e| e.kind).unwrap();
            assert_eq!(c.result, Err(IoError::AbortedByReset), "{mode:?}");
            assert!(c.buf.is_some(), "the reset disabled the controller first");
        }
        assert_eq!(aq.in_flight(), 0);
        // The queue pair was re-created: futures work again.
        let tasks: Vec<Task<'_, DmaBuf>> = (0..4)
            .map(|i| Box::pin(aq.read(1u32, i, 1, nvme::buf(&ctrl, 512))) as Task<'_, DmaBuf>)
            .collect();
        for o in run_all(tasks).0 {
            ok(o);
        }
        aq.close().unwrap();
    }
}

#[test]
fn split_transfers_that_fill_the_queue_before_the_slots_do_wait_instead_of_failing() {
    // MDTS 2^1 pages: a 32 KiB read is split into 4 commands, so the queue
    // pair refuses with QueueFull while the driver still has free slots.
    for mode in nvme::modes() {
        let (_fake, ctrl) = nvme::open(nvme::config(mode.clone(), 1));
        let qp = ctrl
            .create_qpair(QpairOptions {
                depth: 8,
                ..Default::default()
            })
            .unwrap();
        assert!(
            qp.max_transfer() < 32 << 10,
            "{mode:?}: the reads must split"
        );
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        let block = 32 << 10;
        let data = |i: usize| -> Vec<u8> { (0..block).map(|k| (k / 512 + i * 13) as u8).collect() };
        let writes: Vec<Task<'_, DmaBuf>> = (0..12)
            .map(|i| {
                let mut b = nvme::buf(&ctrl, block);
                b.write_at(0, &data(i)).unwrap();
                Box::pin(aq.write(1u32, i as u64 * 64, 64, b)) as Task<'_, DmaBuf>
            })
            .collect();
        for o in run_all(writes).0 {
            ok(o);
        }
        let reads: Vec<Task<'_, DmaBuf>> = (0..12)
            .map(|i| {
                Box::pin(aq.read(1u32, i as u64 * 64, 64, nvme::buf(&ctrl, block)))
                    as Task<'_, DmaBuf>
            })
            .collect();
        for (i, o) in run_all(reads).0.into_iter().enumerate() {
            let mut back = vec![0u8; block];
            ok(o).buf.unwrap().read_at(0, &mut back).unwrap();
            assert!(back == data(i), "{mode:?}: read {i}");
        }
        aq.close().unwrap();
    }
}

const READ10: u8 = 0x28;
const WRITE10: u8 = 0x2A;

/// Poll `tasks` (already started) by hand until every one resolved.
fn finish<B>(tasks: &mut [Option<Task<'_, B>>], cx: &mut Context<'_>) -> Vec<Out<B>> {
    let start = Instant::now();
    let mut out = Vec::new();
    while tasks.iter().any(Option::is_some) {
        for t in tasks.iter_mut() {
            if let Some(f) = t {
                if let Poll::Ready(o) = f.as_mut().poll(cx) {
                    out.push(o);
                    *t = None;
                }
            }
        }
        assert!(start.elapsed() < HANG, "futures did not resolve");
        std::thread::yield_now();
    }
    out
}

#[test]
fn ufs_reset_and_timeout_resolve_pending_futures_once() {
    for mcq in [true, false] {
        // Reset: the device drops the completions; the host controller
        // reset ends each future once, with its buffer.
        let (f, ctrl) = ufs::up(ufs::sync_cfg(mcq), ufs::opts(1));
        let aq = AsyncQueue::new(ctrl.create_qpair(Default::default()).unwrap())
            .expect("an idle queue pair");
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut tasks: Vec<Option<Task<'_, DmaBuf>>> = Vec::new();
        for i in 0..4u64 {
            f.faults()
                .inject_next(None, Some(WRITE10), UfsFault::DropCompletion);
            let b = ufs::buf_with(&ctrl, &ufs::pattern(i, 4096));
            let mut t: Task<'_, DmaBuf> = Box::pin(aq.write(0u8, i, 1, b));
            assert!(t.as_mut().poll(&mut cx).is_pending());
            // One doorbell per command, so each fault rule meets its own.
            aq.drive().unwrap();
            tasks.push(Some(t));
        }
        assert_eq!(aq.in_flight(), 4);
        ctrl.reset().unwrap();
        for o in finish(&mut tasks, &mut cx) {
            let c = o.map_err(|e| e.kind).unwrap();
            assert_eq!(c.result, Err(IoError::AbortedByReset), "mcq={mcq}");
            assert!(c.buf.is_some(), "mcq={mcq}");
        }
        drop(tasks);
        assert_eq!(aq.in_flight(), 0);
        aq.close().unwrap();

        // Timeout: a read the device parks for an hour is aborted.
        let (f, ctrl) = ufs::up(ufs::sync_cfg(mcq), ufs::opts(1));
        let qp = ctrl
            .create_qpair_for::<DmaBuf>(UfsQpairOptions {
                io_timeout: Some(Duration::from_millis(50)),
                timeout_policy: TimeoutPolicy::Abort,
                ..Default::default()
            })
            .unwrap();
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        f.faults().inject_next(
            None,
            Some(READ10),
            UfsFault::Delay(Duration::from_secs(3600)),
        );
        let tasks: Vec<Task<'_, DmaBuf>> = (0..3)
            .map(|i| {
                let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
                Box::pin(aq.read(0u8, i, 1, b)) as Task<'_, DmaBuf>
            })
            .collect();
        let out: Vec<_> = run_all(tasks)
            .0
            .into_iter()
            .map(|o| {
                let c = o.map_err(|e| e.kind).unwrap();
                assert!(c.buf.is_some(), "mcq={mcq}");
                c.result
            })
            .collect();
        assert_eq!(out[0], Err(IoError::TimedOut), "mcq={mcq}");
        assert!(out[1..].iter().all(Result::is_ok), "mcq={mcq}: {out:?}");
        aq.close().unwrap();
    }
}

#[test]
fn a_controller_failure_resolves_pending_futures_once_and_refuses_new_ones() {
    for mode in nvme::modes() {
        let (fake, ctrl) = nvme::open(nvme::config(mode.clone(), 5));
        let qp = ctrl
            .create_qpair(QpairOptions {
                depth: 8,
                io_timeout: None,
                ..Default::default()
            })
            .unwrap();
        let qid = qp.qid();
        let aq = AsyncQueue::new(qp).expect("an idle queue pair");
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut tasks: Vec<Option<Task<'_, DmaBuf>>> = Vec::new();
        for i in 0..3 {
            fake.faults()
                .inject_next(Some(qid), None, Fault::Delay(Duration::from_secs(3600)));
            let mut t: Task<'_, DmaBuf> = Box::pin(aq.write(1u32, i, 1, nvme::buf(&ctrl, 512)));
            assert!(t.as_mut().poll(&mut cx).is_pending());
            tasks.push(Some(t));
        }
        let start = Instant::now();
        while fake.faults().pending() > 0 {
            aq.drive().unwrap();
            assert!(start.elapsed() < HANG);
            std::thread::yield_now();
        }
        fake.set_fatal();
        let out = finish(&mut tasks, &mut cx);
        assert_eq!(out.len(), 3);
        for o in out {
            let c = o.map_err(|e| e.kind).unwrap();
            assert_eq!(c.result, Err(IoError::ControllerFailed), "{mode:?}");
            assert!(c.buf.is_some(), "{mode:?}: the controller is disabled");
        }
        drop(tasks);
        assert!(
            matches!(aq.take_error(), Some(mcqio::Error::ControllerFatal)),
            "{mode:?}: the poll error is kept"
        );
        // A new future is refused at once, with its buffer.
        let (out, _) = run_all(vec![
            Box::pin(aq.read(1u32, 0, 1, nvme::buf(&ctrl, 512))) as Task<'_, DmaBuf>
        ]);
        let e = out.into_iter().next().unwrap().unwrap_err();
        assert_eq!(e.kind, SubmitErrorKind::ControllerFailed, "{mode:?}");
        assert_eq!(aq.in_flight(), 0);
        drop(aq);
    }
}

#[test]
fn futures_dropped_at_random_points_never_free_a_buffer_the_device_still_holds() {
    // A threaded device with random delays; a third of the reads are
    // dropped after one to three polls (before or after their doorbell,
    // before or after their completion).
    let (fake, ctrl) = nvme::open(nvme::config(
        ExecMode::Threaded {
            workers: 2,
            pin_core: None,
        },
        5,
    ));
    fake.faults()
        .set_probability(Fault::Delay(Duration::from_millis(2)), 0.3);
    let qp = ctrl
        .create_qpair_for::<Tracked>(QpairOptions {
            depth: 16,
            ..Default::default()
        })
        .unwrap();
    let aq = AsyncQueue::new(qp).expect("an idle queue pair");
    let mut rng = nvme::rng(26);
    let n = 300;
    let mut drops = Vec::new();
    let mut tasks: Vec<(Option<Task<'_, Tracked>>, Option<u32>)> = (0..n)
        .map(|i| {
            let dropped = Arc::new(AtomicBool::new(false));
            drops.push(dropped.clone());
            let buf = Tracked {
                buf: nvme::buf(&ctrl, 512),
                id: i,
                dropped,
            };
            let t = Box::pin(aq.read(1u32, i as u64 % 128, 1, buf)) as Task<'_, Tracked>;
            let drop_after = (i % 3 == 0).then(|| rand::Rng::gen_range(&mut rng, 1..=3u32));
            (Some(t), drop_after)
        })
        .collect();
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let start = Instant::now();
    let mut resolved = 0;
    while tasks.iter().any(|(t, _)| t.is_some()) {
        for (t, drop_after) in tasks.iter_mut() {
            let Some(f) = t else { continue };
            if let Poll::Ready(o) = f.as_mut().poll(&mut cx) {
                ok(o);
                resolved += 1;
                *t = None;
            } else if let Some(k) = drop_after {
                *k -= 1;
                if *k == 0 {
                    *t = None;
                }
            }
        }
        assert!(start.elapsed() < HANG, "futures did not resolve");
    }
    while aq.in_flight() > 0 {
        aq.drive().unwrap();
        assert!(start.elapsed() < HANG, "abandoned commands did not end");
        std::thread::yield_now();
    }
    assert!(resolved >= 2 * n / 3, "{resolved}");
    assert!(
        drops.iter().all(|d| d.load(Ordering::Acquire)),
        "every buffer released"
    );
    assert_eq!(fake.stats().iommu_faults, 0);
    assert!(fake.iommu().mapped_but_freed().is_empty());
    drop(tasks);
    aq.close().unwrap();
}

/// Flush and deallocate futures (issue 26 item 5), mixed with writes in
/// one executor round on NVMe (sync and threaded) and UFS MCQ: each
/// resolves once to its completion (no buffer); a refused one resolves to
/// `SubmitError<()>`.
#[test]
fn flush_and_deallocate_futures_resolve_beside_reads_and_writes() {
    fn mixed<Q: BlockQueue<Buf = DmaBuf>>(aq: &AsyncQueue<Q>, at: Q::Addr, bufs: Vec<DmaBuf>) {
        let mut tasks: Vec<Task<'_, DmaBuf>> = Vec::new();
        for (i, b) in bufs.into_iter().enumerate() {
            tasks.push(Box::pin(aq.write(at, i as u64, 1, b)));
        }
        tasks.push(Box::pin(async move {
            let c = aq
                .flush(at)
                .await
                .map_err(|e| e.kind)
                .expect("flush submitted");
            assert!(c.buf.is_none());
            Ok(c)
        }));
        tasks.push(Box::pin(async move {
            let c = aq
                .deallocate(at, 64, 8)
                .await
                .map_err(|e| e.kind)
                .expect("deallocate submitted");
            assert!(c.buf.is_none());
            Ok(c)
        }));
        let n = tasks.len();
        let out = run_all(tasks).0;
        assert_eq!(out.len(), n);
        for o in out {
            ok(o);
        }
        assert_eq!(aq.in_flight(), 0);
    }
    for mode in nvme::modes() {
        let (_fake, ctrl) = nvme::open(nvme::config(mode.clone(), 5));
        let aq = AsyncQueue::new(ctrl.create_qpair(QpairOptions::default()).unwrap())
            .expect("an idle queue pair");
        mixed(&aq, 1u32, (0..6).map(|_| nvme::buf(&ctrl, 512)).collect());
        // Refused: no such namespace; the refusal carries no buffer.
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag);
        let mut f = aq.flush(99u32);
        match Pin::new(&mut f).poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(Err(SubmitError { kind, buf: () })) => assert!(
                matches!(kind, SubmitErrorKind::UnknownNamespace { nsid: 99 }),
                "{kind:?}"
            ),
            r => panic!("{mode:?}: {:?}", r.map(|o| o.map(|c| c.result))),
        }
        drop(f);
        aq.close().unwrap();
    }
    let (_f, ctrl) = ufs::up(ufs::threaded_cfg(true, 1), ufs::opts(1));
    let aq = AsyncQueue::new(ctrl.create_qpair(Default::default()).unwrap())
        .expect("an idle queue pair");
    mixed(
        &aq,
        0u8,
        (0..6)
            .map(|i| ufs::buf_with(&ctrl, &ufs::pattern(i, 4096)))
            .collect(),
    );
    aq.close().unwrap();
}
