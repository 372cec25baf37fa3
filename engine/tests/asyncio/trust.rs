//! The async driver's guarantees under ordinary async code (issue 39
//! items 1–3): a future that is alive but not polled stalls nobody, a
//! queue pair with commands of its own is never wrapped (so a future only
//! ever resolves with its own command's completion), and a future waiting
//! for a slot is woken through the waker of its most recent poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::{AsyncQueue, QpairOptions};
use mcqio_fixtures::testing::engine::asyncio::Flag;
use mcqio_fixtures::testing::engine::nvme;
use mcqio_fixtures::{ExecMode, FakeConfig};

/// Long enough that only a lost wake-up reaches it.
const HANG: Duration = Duration::from_secs(10);

fn flag() -> (Arc<Flag>, Waker) {
    Flag::new(false)
}

fn threaded_with_latency(ms: u64) -> FakeConfig {
    FakeConfig {
        latency: Duration::from_millis(ms),
        ..nvme::config(
            ExecMode::Threaded {
                workers: 1,
                pin_core: None,
            },
            5,
        )
    }
}

/// Poll `f` each time its waker fires, and only then, until it resolves
/// or `HANG` passes; returns the output and how long it took.
fn poll_when_woken<F: Future + Unpin>(f: &mut F) -> Option<(F::Output, Duration)> {
    let (flag, waker) = flag();
    let mut cx = Context::from_waker(&waker);
    let start = Instant::now();
    flag.0.store(true, Ordering::Release);
    while start.elapsed() < HANG {
        if flag.0.swap(false, Ordering::AcqRel) {
            if let Poll::Ready(o) = Pin::new(&mut *f).poll(&mut cx) {
                return Some((o, start.elapsed()));
            }
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    None
}

/// Item 1: future A is polled (it submits, and is the one the old
/// driver let keep the queue polled) and then left alone, alive, as a
/// `select!` over `&mut a` leaves it when its other branch wins; future
/// B, polled only when its waker fires, must still resolve once its read
/// completed on the device (20 ms), and A's completion must wait for A.
#[test]
fn a_future_left_unpolled_does_not_stall_the_others() {
    let (_fake, ctrl) = nvme::open(threaded_with_latency(20));
    let qp = ctrl
        .create_qpair(QpairOptions {
            depth: 8,
            io_timeout: None,
            ..Default::default()
        })
        .unwrap();
    let aq = AsyncQueue::new(qp).expect("an idle queue pair");
    let (_fa, wa) = flag();
    let mut a = aq.read(1u32, 0, 1, nvme::buf(&ctrl, 512));
    for _ in 0..2 {
        assert!(Pin::new(&mut a)
            .poll(&mut Context::from_waker(&wa))
            .is_pending());
    }
    let mut b = aq.read(1u32, 8, 1, nvme::buf(&ctrl, 512));
    let (out, took) = poll_when_woken(&mut b)
        .expect("B's read completed on the device, but B was never woken while A sat unpolled");
    let c = out.map_err(|e| e.kind).expect("submitted");
    c.result.expect("read");
    assert!(c.buf.is_some());
    assert!(took >= Duration::from_millis(20), "{took:?}");
    // A resolves too, once polled.
    let (out, _) = poll_when_woken(&mut a).expect("A resolves");
    out.map_err(|e| e.kind).unwrap().result.unwrap();
    drop((a, b));
    aq.close().unwrap();
}

/// Item 2: a read of a 0xAA block submitted on the queue pair itself,
/// then the queue pair wrapped. The old driver took it and handed that
/// read's completion (tag 0 = slot 0) to the first future, which read a
/// 0x55 block. A busy queue pair is refused, given back whole, and its
/// own command completes through it as if nothing happened.
#[test]
fn a_queue_pair_with_commands_of_its_own_is_refused_and_given_back() {
    let (_fake, ctrl) = nvme::open(nvme::config(ExecMode::Sync, 5));
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth: 4,
            ..Default::default()
        })
        .unwrap();
    let block = |b: u8| {
        let mut buf = nvme::buf(&ctrl, 512);
        buf.fill(b);
        buf
    };
    for (lba, b) in [(0u64, 0xaau8), (8, 0x55)] {
        qp.write(1u32, lba, 1, block(b), 100).unwrap();
        BlockQueue::submit(&mut qp);
        let got = nvme::wait_n(&mut qp, 1);
        got[0].result.unwrap();
    }
    qp.read(1u32, 0, 1, nvme::buf(&ctrl, 512), 0).unwrap();
    let refused = match AsyncQueue::new(qp) {
        Ok(_) => panic!("a queue pair with a read outstanding was wrapped"),
        Err(e) => e,
    };
    assert_eq!(refused.outstanding(), 1, "{refused}");
    let mut qp = refused.into_queue();
    BlockQueue::submit(&mut qp);
    let got = nvme::wait_n(&mut qp, 1);
    assert_eq!(got[0].tag, 0);
    let mut bytes = [0u8; 512];
    got[0].buf.as_ref().unwrap().read_at(0, &mut bytes).unwrap();
    assert!(bytes.iter().all(|&b| b == 0xaa));
    drop(got);
    // Idle again: wrapped, and a future reads its own block.
    let aq = AsyncQueue::caller_driven(qp).expect("idle now");
    let mut f = aq.read(1u32, 8, 1, nvme::buf(&ctrl, 512));
    let (_flag, w) = flag();
    let mut cx = Context::from_waker(&w);
    let start = Instant::now();
    let c = loop {
        if let Poll::Ready(o) = Pin::new(&mut f).poll(&mut cx) {
            break o.map_err(|e| e.kind).unwrap();
        }
        aq.drive().unwrap();
        assert!(start.elapsed() < HANG);
    };
    c.buf.unwrap().read_at(0, &mut bytes).unwrap();
    assert!(bytes.iter().all(|&b| b == 0x55));
    drop(f);
    aq.close().unwrap();
}

/// Item 3: a future waiting for a free slot, polled again in the same
/// round by another task (a new waker), must be woken through the new
/// waker when a slot frees; the old driver kept the first one only.
#[test]
fn a_slot_waiter_is_woken_through_its_latest_waker() {
    let (_fake, ctrl) = nvme::open(nvme::config(ExecMode::Sync, 5));
    let qp = ctrl
        .create_qpair(QpairOptions {
            depth: 1,
            ..Default::default()
        })
        .unwrap();
    let aq = AsyncQueue::caller_driven(qp).expect("idle");
    let (_f0, w0) = flag();
    let mut first = aq.read(1u32, 0, 1, nvme::buf(&ctrl, 512));
    assert!(Pin::new(&mut first)
        .poll(&mut Context::from_waker(&w0))
        .is_pending());
    let (old, w_old) = flag();
    let (new, w_new) = flag();
    let mut waiter = aq.read(1u32, 8, 1, nvme::buf(&ctrl, 512));
    assert!(Pin::new(&mut waiter)
        .poll(&mut Context::from_waker(&w_old))
        .is_pending());
    // Moved to another task before any slot freed.
    assert!(Pin::new(&mut waiter)
        .poll(&mut Context::from_waker(&w_new))
        .is_pending());
    old.0.store(false, Ordering::Release);
    new.0.store(false, Ordering::Release);
    let start = Instant::now();
    while aq.in_flight() > 0 {
        aq.drive().unwrap();
        assert!(start.elapsed() < HANG);
    }
    // `first` completed; taking its completion frees the slot.
    assert!(Pin::new(&mut first)
        .poll(&mut Context::from_waker(&w0))
        .is_ready());
    assert!(
        new.0.load(Ordering::Acquire),
        "the slot freed, but the waiter's latest waker was not woken (old woken: {})",
        old.0.load(Ordering::Acquire)
    );
    let (out, _) = poll_when_woken_driving(&aq, &mut waiter);
    out.map_err(|e| e.kind).unwrap().result.unwrap();
    drop((first, waiter));
    aq.close().unwrap();
}

/// Poll `f` until it resolves, driving `aq` between polls.
fn poll_when_woken_driving<Q: BlockQueue, F: Future + Unpin>(
    aq: &AsyncQueue<Q>,
    f: &mut F,
) -> (F::Output, Duration) {
    let (_flag, waker) = flag();
    let mut cx = Context::from_waker(&waker);
    let start = Instant::now();
    loop {
        if let Poll::Ready(o) = Pin::new(&mut *f).poll(&mut cx) {
            return (o, start.elapsed());
        }
        aq.drive().unwrap();
        assert!(start.elapsed() < HANG, "did not resolve");
    }
}
