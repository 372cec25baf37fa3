//! Waiting on NVMe/TCP (issue 26 on the third wire): a queue pair in
//! `Interrupt` or `Hybrid` mode sleeps until its connection's socket is
//! readable, through the same `wait`, `arm_sleep`/`slept` and async
//! drivers as the PCIe and UFS queue pairs, against the fake target of
//! `mcqio-fixtures` on loopback: woken by the socket, many short waits
//! with no lost wake-up, the hybrid spin, timeouts and Keep Alive while
//! asleep, a dropped connection ending a sleeping wait with its typed
//! error, and the async drivers (the tokio ones with `--features tokio`).

use std::future::Future;
use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::nvme::tcp::{TcpController, TcpError, TcpOptions, TcpQueuePair};
use mcqio::vfio::DmaDir;
use mcqio::{
    AsyncQueue, Completion, DmaBuf, Interrupt, IoError, QpairOptions, SubmitError, TimeoutPolicy,
    WaitPolicy,
};
use mcqio_fixtures::tcp::{FakeTcpTarget, TcpFault, TcpTargetConfig, TcpTargetStats};

use mcqio_fixtures::testing::engine::tcp::{connect, pattern, qpair, start, tcp_error};

/// Namespace 1 of the default target: 2048 blocks of 512 B in RAM.
const NS: u32 = 1;
const READ: u8 = 0x02;
const HANG: Duration = Duration::from_secs(20);

/// A target that takes `latency` before each I/O answer (a slow target:
/// the waits really sleep).
fn slow(latency: Duration) -> FakeTcpTarget {
    start(TcpTargetConfig {
        latency,
        ..Default::default()
    })
}

/// Submit one 512-byte read or write at `lba` and `wait` for it.
fn io_wait(
    q: &mut TcpQueuePair,
    c: &TcpController,
    read: bool,
    lba: u64,
    data: &[u8],
) -> Completion<DmaBuf> {
    let mut b = c.alloc_buf(data.len(), DmaDir::Bidirectional).unwrap();
    let blocks = (data.len() / 512) as u32;
    if read {
        b.fill(0xEE);
        q.read(NS, lba, blocks, b, lba).map_err(|e| e.kind).unwrap();
    } else {
        b.write_at(0, data).unwrap();
        q.write(NS, lba, blocks, b, lba)
            .map_err(|e| e.kind)
            .unwrap();
    }
    q.submit();
    let mut got = None;
    let end = Instant::now() + HANG;
    while got.is_none() {
        assert!(Instant::now() < end, "a hang");
        q.wait(1, Some(Duration::from_secs(5)), |c| got = Some(c))
            .expect("wait");
    }
    let c = got.unwrap();
    assert_eq!(c.tag, lba);
    c
}

/// An `Interrupt` queue pair against a slow target sleeps in its waits,
/// and the socket (not the slice) ends the sleeps; the data is right.
/// A polled one never sleeps, and only the waiting one has an interrupt
/// to hand to a driver that sleeps elsewhere.
#[test]
fn an_interrupt_queue_pair_sleeps_and_the_socket_wakes_it() {
    let t = slow(Duration::from_millis(2));
    let c = connect(&t, TcpOptions::default());
    let mut q = qpair(&c, 8, WaitPolicy::Interrupt);
    assert!(
        matches!(q.interrupt(), Some(Interrupt::Ready(_))),
        "a readiness, not an eventfd"
    );
    assert!(qpair(&c, 8, WaitPolicy::Poll).interrupt().is_none());
    for i in 0..50u64 {
        let data = pattern(512, i);
        assert_eq!(io_wait(&mut q, &c, false, i, &data).result, Ok(()));
        let back = io_wait(&mut q, &c, true, i, &data);
        assert_eq!(back.buf.unwrap().to_vec(), data, "block {i}");
    }
    let n = q.counters();
    assert_eq!(n.completed, 100);
    assert!(
        n.interrupt_sleeps >= 50,
        "each 2 ms answer is slept on: {n:?}"
    );
    // A 2 ms answer ends its sleep long before the 10 ms slice: nearly
    // every sleep is ended by the socket (a loaded host may let a few
    // run out).
    assert!(
        n.interrupt_wakeups * 10 >= n.interrupt_sleeps * 9,
        "the socket ends the sleeps: {n:?}"
    );
    // The polled twin never sleeps.
    let mut p = qpair(&c, 8, WaitPolicy::Poll);
    for i in 0..5u64 {
        assert_eq!(io_wait(&mut p, &c, true, i, &[0; 512]).result, Ok(()));
    }
    assert_eq!(p.counters().interrupt_sleeps, 0);
}

/// Many short waits, each sleeping where it finds nothing, on a target
/// that answers at once (the answer races the arm) and on one that
/// answers a little later, through `arm_sleep`, a second poll and a
/// `poll(2)` of the interrupt's descriptor for up to 20 s (as an io_uring
/// or a reactor would sleep): a wake-up lost anywhere would show as a
/// sleep that ran out. Then the same through `wait`.
#[test]
fn many_short_waits_lose_no_wake_up() {
    for latency in [Duration::ZERO, Duration::from_micros(300)] {
        let t = slow(latency);
        let c = connect(&t, TcpOptions::default());
        let mut q = qpair(&c, 4, WaitPolicy::Interrupt);
        let irq = q.interrupt().expect("an interrupt");
        let fd = irq.as_fd().as_raw_fd();
        let mut buf = Some(c.alloc_buf(512, DmaDir::Bidirectional).unwrap());
        let mut ran_out = 0;
        let rounds = if latency.is_zero() { 2000 } else { 300 };
        for i in 0..rounds {
            q.read(NS, i % 64, 1, buf.take().unwrap(), i).unwrap();
            q.submit();
            loop {
                if q.poll(1, |c| buf = c.buf).unwrap() > 0 {
                    break;
                }
                let Some(sleep) = BlockQueue::arm_sleep(&mut q) else {
                    continue;
                };
                assert_eq!(sleep.interrupt.as_fd().as_raw_fd(), fd, "one descriptor");
                if q.poll(1, |c| buf = c.buf).unwrap() > 0 {
                    break;
                }
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd for the duration of the call.
                let r = unsafe { libc::poll(&mut p, 1, 20_000) };
                assert!(r >= 0);
                BlockQueue::slept(&mut q, r == 1);
                ran_out += usize::from(r == 0);
            }
        }
        assert_eq!(ran_out, 0, "{latency:?}: a sleep ran out its 20 s");
        let n = q.counters();
        assert!(n.interrupt_sleeps > 0, "{latency:?}: it slept: {n:?}");
        assert_eq!(n.interrupt_sleeps, n.interrupt_wakeups, "{latency:?}");
        // The same through `wait`, with a limit far beyond the answers.
        let before = q.counters();
        for i in 0..rounds {
            q.read(NS, i % 64, 1, buf.take().unwrap(), i).unwrap();
            q.submit();
            let t0 = Instant::now();
            while q.wait(1, Some(HANG), |c| buf = c.buf).unwrap() == 0 {}
            assert!(t0.elapsed() < Duration::from_secs(5), "a lost wake-up");
        }
        let n = q.counters();
        assert_eq!(n.completed - before.completed, rounds);
        assert!(n.interrupt_sleeps > before.interrupt_sleeps, "{n:?}");
    }
}

/// At depth 16 with receive pacing on, a sleep is never taken while an
/// answer the pacer held back is already in the socket: each sleep is
/// followed by a receive, so the sleeps stay about one per answer that
/// arrives, rather than one per empty poll of a held queue.
#[test]
fn a_paced_queue_does_not_sleep_on_an_answer_it_held_back() {
    let t = slow(Duration::from_micros(200));
    let c = connect(&t, TcpOptions::default());
    let mut q = qpair(&c, 16, WaitPolicy::Interrupt);
    let mut bufs: Vec<DmaBuf> = (0..16)
        .map(|_| c.alloc_buf(4096, DmaDir::Bidirectional).unwrap())
        .collect();
    let total = 1600u64;
    let (mut sent, mut done) = (0u64, 0u64);
    let end = Instant::now() + HANG;
    while done < total {
        assert!(Instant::now() < end, "a hang");
        while sent < total {
            let Some(b) = bufs.pop() else { break };
            q.read(NS, sent % 256, 8, b, sent).unwrap();
            sent += 1;
        }
        q.submit();
        q.wait(16, Some(HANG), |c| {
            c.result.unwrap();
            bufs.push(c.buf.unwrap());
            done += 1;
        })
        .unwrap();
    }
    let n = q.counters();
    let s = q.stats();
    assert!(n.interrupt_sleeps > 0, "{n:?}");
    assert!(
        s.recvs >= n.interrupt_sleeps,
        "every sleep is followed by a receive: {n:?} {s:?}"
    );
    assert!(
        n.interrupt_sleeps <= 2 * total,
        "sleeps per answer stay bounded: {n:?} {s:?}"
    );
}

/// Hybrid: spins while its window after the last completion runs, then
/// sleeps on the socket like `Interrupt`.
#[test]
fn hybrid_spins_after_a_completion_then_sleeps_on_the_socket() {
    let t = slow(Duration::from_millis(1));
    let c = connect(&t, TcpOptions::default());
    let long = WaitPolicy::Hybrid {
        spin: Duration::from_secs(600),
    };
    let mut q = qpair(&c, 4, long);
    assert_eq!(io_wait(&mut q, &c, true, 0, &[0; 512]).result, Ok(()));
    let first = q.counters().interrupt_sleeps;
    for i in 1..100 {
        assert_eq!(io_wait(&mut q, &c, true, i, &[0; 512]).result, Ok(()));
    }
    assert_eq!(q.counters().interrupt_sleeps, first, "inside the spin");
    let mut z = qpair(
        &c,
        4,
        WaitPolicy::Hybrid {
            spin: Duration::ZERO,
        },
    );
    for i in 0..50 {
        assert_eq!(io_wait(&mut z, &c, true, i, &[0; 512]).result, Ok(()));
    }
    let n = z.counters();
    assert!(n.interrupt_sleeps >= 50, "a zero spin sleeps: {n:?}");
    assert!(n.interrupt_wakeups > 0, "{n:?}");
    // A short spin: sleeps only when an answer takes longer than it.
    let mut h = qpair(
        &c,
        4,
        WaitPolicy::Hybrid {
            spin: Duration::from_micros(100),
        },
    );
    for i in 0..50 {
        assert_eq!(io_wait(&mut h, &c, true, i, &[0; 512]).result, Ok(()));
    }
    assert!(h.counters().interrupt_sleeps > 0);
}

/// A command the target holds past its timeout, waited on asleep: the
/// slices that run out keep the clock going, the timeout fires (Abort,
/// then the reconnect), and the command ends once, typed, long before
/// the target would have answered; the queue carries on asleep on its
/// new connection (the same descriptor).
#[test]
fn a_timeout_fires_while_the_wait_sleeps_and_the_queue_carries_on() {
    let t = start(TcpTargetConfig::default());
    let c = connect(&t, TcpOptions::default());
    let mut q = c
        .create_qpair(QpairOptions {
            depth: 8,
            wait: WaitPolicy::Interrupt,
            io_timeout: Some(Duration::from_millis(200)),
            timeout_policy: TimeoutPolicy::Abort,
            ..Default::default()
        })
        .unwrap();
    let fd = q.interrupt().unwrap().as_fd().as_raw_fd();
    t.faults().inject_next(
        Some(q.qid()),
        Some(READ),
        TcpFault::Delay(Duration::from_secs(3)),
    );
    let b = c.alloc_buf(512, DmaDir::Bidirectional).unwrap();
    q.read(NS, 0, 1, b, 4).map_err(|e| e.kind).unwrap();
    q.submit();
    let start = Instant::now();
    let mut got = None;
    while got.is_none() {
        assert!(start.elapsed() < HANG, "a hang");
        q.wait(1, None, |c| got = Some(c)).unwrap();
    }
    let done = got.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "ended by the timeout, not the answer"
    );
    assert_eq!(done.result, Err(IoError::AbortedByReset));
    let n = q.counters();
    assert_eq!((n.timeouts, n.recoveries), (1, 1), "{n:?}");
    assert!(
        n.interrupt_sleeps > n.interrupt_wakeups,
        "slices ran out while it slept: {n:?}"
    );
    assert_eq!(q.interrupt().unwrap().as_fd().as_raw_fd(), fd);
    let data = pattern(512, 3);
    assert_eq!(io_wait(&mut q, &c, false, 9, &data).result, Ok(()));
    assert_eq!(
        io_wait(&mut q, &c, true, 9, &data).buf.unwrap().to_vec(),
        data
    );
}

/// Keep Alive keeps going while the only queue pair sleeps on a command
/// the target holds for three KATOs: the slices that run out send it.
#[test]
fn keep_alive_is_sent_while_the_wait_sleeps() {
    let t = start(TcpTargetConfig::default());
    let c = connect(
        &t,
        TcpOptions {
            kato: Duration::from_millis(300),
            ..Default::default()
        },
    );
    let mut q = qpair(&c, 4, WaitPolicy::Interrupt);
    t.faults().inject_next(
        Some(q.qid()),
        Some(READ),
        TcpFault::Delay(Duration::from_millis(900)),
    );
    let ka = c.keep_alives();
    let data = io_wait(&mut q, &c, true, 0, &[0; 512]);
    assert_eq!(data.result, Ok(()), "answered after 900 ms");
    assert!(
        c.keep_alives() >= ka + 3,
        "KATO/2 = 150 ms: {} keep alives in 900 ms asleep",
        c.keep_alives() - ka
    );
    assert_eq!(TcpTargetStats::get(&t.stats().kato_expired), 0);
    assert!(q.counters().interrupt_sleeps > 0);
}

/// The target drops the connection in the middle of a read it answers
/// 300 ms late: the sleeping wait is woken by the socket's end of stream
/// and ends with the connection's typed error, never a hang.
#[test]
fn a_dropped_connection_ends_a_sleeping_wait_with_its_typed_error() {
    let t = slow(Duration::from_millis(300));
    let c = connect(&t, TcpOptions::default());
    let mut q = qpair(&c, 4, WaitPolicy::Interrupt);
    t.faults()
        .inject_next(Some(q.qid()), Some(READ), TcpFault::Disconnect);
    let b = c.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
    q.read(NS, 0, 8, b, 1).map_err(|e| e.kind).unwrap();
    q.submit();
    let start = Instant::now();
    let mut ended = Vec::new();
    let err = loop {
        assert!(start.elapsed() < HANG, "a hang");
        match q.wait(4, Some(HANG), |c| ended.push(c)) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(matches!(tcp_error(&err), TcpError::Closed), "{err:?}");
    assert_eq!(ended.len(), 1, "the read ended once");
    assert_eq!(ended[0].result, Err(IoError::ConnectionLost));
    assert!(ended[0].buf.is_some(), "its buffer came back");
    let n = q.counters();
    assert!(n.interrupt_sleeps > 0, "it slept: {n:?}");
    assert!(n.interrupt_wakeups > 0, "the socket woke it: {n:?}");
    // The queue reports the error; a reset brings it back.
    assert!(q.wait(1, Some(Duration::ZERO), drop).is_err());
    c.reset().unwrap();
    q.poll(1, |_| panic!("nothing in flight")).unwrap();
    assert_eq!(io_wait(&mut q, &c, true, 2, &[0; 512]).result, Ok(()));
}

/// A task's waker: sets its flag.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

type Out<B> = Result<Completion<B>, SubmitError<B>>;
type Task<'a, B> = Pin<Box<dyn Future<Output = Out<B>> + 'a>>;

/// A minimal executor: polls the woken tasks until all resolved.
fn run_all<B>(tasks: Vec<Task<'_, B>>) -> Vec<Out<B>> {
    let flags: Vec<Arc<Flag>> = tasks
        .iter()
        .map(|_| Arc::new(Flag(AtomicBool::new(true))))
        .collect();
    let wakers: Vec<Waker> = flags.iter().map(|f| Waker::from(f.clone())).collect();
    let mut tasks: Vec<Option<Task<'_, B>>> = tasks.into_iter().map(Some).collect();
    let mut out: Vec<Option<Out<B>>> = tasks.iter().map(|_| None).collect();
    let start = Instant::now();
    while out.iter().any(Option::is_none) {
        let mut any = false;
        for i in 0..tasks.len() {
            if !flags[i].0.swap(false, Ordering::AcqRel) {
                continue;
            }
            let Some(t) = tasks[i].as_mut() else { continue };
            any = true;
            if let Poll::Ready(o) = t.as_mut().poll(&mut Context::from_waker(&wakers[i])) {
                out[i] = Some(o);
                tasks[i] = None;
            }
        }
        assert!(
            any || out.iter().all(Option::is_some),
            "no task woken: a lost wake-up"
        );
        assert!(start.elapsed() < HANG, "futures did not resolve");
    }
    out.into_iter().map(Option::unwrap).collect()
}

/// The executor-agnostic driver on a waiting TCP queue pair: many
/// futures at once (more than the queue holds), data checked; then
/// caller-driven futures completed by `AsyncQueue::wait`, which sleeps on
/// the socket.
#[test]
fn async_futures_on_a_waiting_tcp_queue_pair() {
    let t = slow(Duration::from_micros(500));
    let c = connect(&t, TcpOptions::default());
    let aq = AsyncQueue::new(qpair(&c, 8, WaitPolicy::Interrupt)).expect("an idle queue pair");
    let n = 40u64;
    let writes: Vec<Task<'_, DmaBuf>> = (0..n)
        .map(|i| {
            let mut b = c.alloc_buf(512, DmaDir::Bidirectional).unwrap();
            b.write_at(0, &pattern(512, i)).unwrap();
            Box::pin(aq.write(NS, i, 1, b)) as Task<'_, DmaBuf>
        })
        .collect();
    for o in run_all(writes) {
        o.map_err(|e| e.kind).unwrap().result.unwrap();
    }
    let reads: Vec<Task<'_, DmaBuf>> = (0..n)
        .map(|i| {
            let b = c.alloc_buf(512, DmaDir::Bidirectional).unwrap();
            Box::pin(aq.read(NS, i, 1, b)) as Task<'_, DmaBuf>
        })
        .collect();
    for (i, o) in run_all(reads).into_iter().enumerate() {
        let d = o.map_err(|e| e.kind).unwrap();
        assert_eq!(d.buf.unwrap().to_vec(), pattern(512, i as u64), "block {i}");
    }
    aq.close().unwrap();

    // The caller-driven half waits on a target slow enough that the
    // answer cannot come before the wait's first empty poll, even when
    // the whole path is emulated (under qemu-user 500 us passed before
    // it, every run, and the wait never slept).
    let t = slow(Duration::from_millis(50));
    let c = connect(&t, TcpOptions::default());
    let mut w = qpair(&c, 8, WaitPolicy::Poll);
    io_wait(&mut w, &c, false, 3, &pattern(512, 3));
    w.close(drop).unwrap();
    let aq =
        AsyncQueue::caller_driven(qpair(&c, 8, WaitPolicy::Interrupt)).expect("an idle queue pair");
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut f = aq.read(NS, 3, 1, c.alloc_buf(512, DmaDir::Bidirectional).unwrap());
    assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
    let start = Instant::now();
    while !flag.0.swap(false, Ordering::AcqRel) {
        aq.wait(Some(Duration::from_millis(50))).unwrap();
        assert!(start.elapsed() < HANG);
    }
    match Pin::new(&mut f).poll(&mut cx) {
        Poll::Ready(o) => assert_eq!(
            o.map_err(|e| e.kind).unwrap().buf.unwrap().to_vec(),
            pattern(512, 3)
        ),
        Poll::Pending => panic!("woken before its completion was recorded"),
    }
    drop(f);
    let n = aq.with_queue(|q| q.counters());
    assert!(n.interrupt_sleeps > 0, "wait slept on the socket: {n:?}");
    aq.close().unwrap();
}

/// `AsyncQueue::tokio` on NVMe/TCP: the keeper sleeps in the runtime's
/// epoll on the queue's epoll set (a duplicate of its descriptor), woken
/// by the socket; a slow command is awaited asleep, not by spinning the
/// executor; a reset with futures pending resolves each once and the
/// futures after it run on the new connection through the same
/// registration.
#[cfg(feature = "tokio")]
mod on_tokio {
    use super::*;
    use std::rc::Rc;
    use tokio::task::LocalSet;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn many_futures_sleep_on_the_socket() {
        let t = slow(Duration::from_micros(500));
        let c = connect(&t, TcpOptions::default());
        let rt = runtime();
        LocalSet::new().block_on(&rt, async {
            let aq = Rc::new(AsyncQueue::tokio(qpair(&c, 8, WaitPolicy::Interrupt)).unwrap());
            let n = 32u64;
            let mut tasks = Vec::new();
            for i in 0..n {
                let (aq, mut b) = (aq.clone(), c.alloc_buf(512, DmaDir::Bidirectional).unwrap());
                b.write_at(0, &pattern(512, i)).unwrap();
                tasks.push(tokio::task::spawn_local(async move {
                    aq.write(NS, i, 1, b)
                        .await
                        .map_err(|e| e.kind)
                        .unwrap()
                        .result
                        .unwrap();
                }));
            }
            for t in tasks {
                t.await.expect("write task");
            }
            let mut tasks = Vec::new();
            for i in 0..n {
                let (aq, b) = (aq.clone(), c.alloc_buf(512, DmaDir::Bidirectional).unwrap());
                tasks.push(tokio::task::spawn_local(async move {
                    let d = aq.read(NS, i, 1, b).await.map_err(|e| e.kind).unwrap();
                    assert_eq!(d.buf.unwrap().to_vec(), pattern(512, i), "block {i}");
                }));
            }
            for t in tasks {
                t.await.expect("read task");
            }
            let n = aq.with_queue(|q| q.counters());
            assert_eq!(n.completed, 64);
            assert!(n.interrupt_wakeups > 0, "the socket woke the keeper: {n:?}");
            Rc::try_unwrap(aq)
                .ok()
                .expect("tasks done")
                .close()
                .unwrap();
        });
    }

    /// Counts the polls of the future it wraps.
    struct Counted<F> {
        f: Pin<Box<F>>,
        polls: Rc<std::cell::Cell<usize>>,
    }

    impl<F: Future> Future for Counted<F> {
        type Output = F::Output;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            self.polls.set(self.polls.get() + 1);
            self.f.as_mut().poll(cx)
        }
    }

    #[test]
    fn a_slow_command_is_awaited_asleep_and_a_reset_moves_the_socket() {
        let t = start(TcpTargetConfig::default());
        let c = connect(&t, TcpOptions::default());
        let rt = runtime();
        rt.block_on(async {
            let q = qpair(&c, 4, WaitPolicy::Interrupt);
            t.faults().inject_next(
                Some(q.qid()),
                Some(READ),
                TcpFault::Delay(Duration::from_millis(300)),
            );
            let aq = AsyncQueue::tokio(q).unwrap();
            let polls = Rc::new(std::cell::Cell::new(0));
            let start = Instant::now();
            let f = Counted {
                f: Box::pin(aq.read(NS, 0, 1, c.alloc_buf(512, DmaDir::Bidirectional).unwrap())),
                polls: polls.clone(),
            };
            f.await.map_err(|e| e.kind).unwrap().result.unwrap();
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(300));
            let slices = took.as_millis() as usize / 10 + 1;
            let n = aq.with_queue(|q| q.counters());
            assert!(
                polls.get() <= 3 * slices + 8,
                "{} polls in {took:?}: the keeper spun ({n:?})",
                polls.get()
            );
            // A reset with a future pending: it resolves once, then the
            // queue works on its new connection, still asleep between.
            t.faults().inject_next(
                Some(aq.with_queue(|q| q.qid())),
                Some(READ),
                TcpFault::Delay(Duration::from_millis(500)),
            );
            let mut pending =
                Box::pin(aq.read(NS, 1, 1, c.alloc_buf(512, DmaDir::Bidirectional).unwrap()));
            let early = tokio::time::timeout(Duration::from_millis(50), &mut pending).await;
            assert!(early.is_err(), "the target holds it for 500 ms");
            c.reset().unwrap();
            let d = pending.await.map_err(|e| e.kind).unwrap();
            assert_eq!(d.result, Err(IoError::AbortedByReset));
            assert!(d.buf.is_some());
            let before = aq.with_queue(|q| q.counters());
            for i in 0..20u64 {
                let mut b = c.alloc_buf(512, DmaDir::Bidirectional).unwrap();
                b.write_at(0, &pattern(512, i)).unwrap();
                aq.write(NS, 100 + i, 1, b)
                    .await
                    .map_err(|e| e.kind)
                    .unwrap()
                    .result
                    .unwrap();
                let d = aq
                    .read(
                        NS,
                        100 + i,
                        1,
                        c.alloc_buf(512, DmaDir::Bidirectional).unwrap(),
                    )
                    .await
                    .map_err(|e| e.kind)
                    .unwrap();
                assert_eq!(d.buf.unwrap().to_vec(), pattern(512, i));
            }
            let n = aq.with_queue(|q| q.counters());
            assert_eq!(n.recoveries, 1, "{n:?}");
            assert!(n.completed >= before.completed + 40);
            aq.close().unwrap();
        });
    }
}
