//! The async driver's cost per I/O: `n` 4 KiB reads at queue depth `q`
//! through [`AsyncQueue`] on the fake controller's null namespace, run
//! inside the doorbell store (`ExecMode::Sync`), so one thread holds
//! everything and callgrind counts it exactly.
//!
//! ```text
//! cargo build --profile dist -p mcqio --example async_bench
//! for n in 200000 1000000; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$n \
//!     target/dist/examples/async_bench [new|caller] -q 32 -n $n
//! done
//! ```
//!
//! Per I/O = (Ir(1,000,000) − Ir(200,000)) / 800,000, which cancels
//! bring-up. Each of the `q` tasks reads in a loop (one future at a time,
//! as an `async fn` awaiting each read would); the executor here is the
//! smallest that honours wakers: a flag per task, polled round-robin.
//! `new` lets the futures keep the queue polled; `caller` polls it with
//! [`AsyncQueue::drive`] between executor rounds (`caller_driven`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use mcqio::vfio::{Backend, DmaDir};
use mcqio::{AsyncQueue, Controller, ControllerOptions, DmaBuf, QpairOptions, QueuePair};
use mcqio_fixtures::testing::engine::asyncio::Flag;
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, NamespaceConfig};

/// One task: `count` reads, one after another, each at the next LBA.
async fn reader(aq: &AsyncQueue<QueuePair>, mut buf: DmaBuf, first: u64, count: u64) -> u64 {
    let mut done = 0;
    for k in 0..count {
        let lba = ((first + k * 8) * 8) & ((1 << 30) - 1);
        let c = match aq.read(1, lba, 8, buf).await {
            Ok(c) => c,
            Err(e) => panic!("read refused: {:?}", e.kind),
        };
        if let Err(e) = c.result {
            panic!("read failed: {e}");
        }
        buf = c.buf.expect("handed back");
        done += 1;
    }
    done
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut caller = false;
    let mut q = 32usize;
    let mut n = 1_000_000u64;
    while let Some(a) = args.next() {
        match a.as_str() {
            "new" => caller = false,
            "caller" => caller = true,
            "-q" => q = args.next().and_then(|v| v.parse().ok()).expect("-q N"),
            "-n" => n = args.next().and_then(|v| v.parse().ok()).expect("-n N"),
            other => panic!("unknown argument {other}: [new|caller] [-q N] [-n N]"),
        }
    }
    let backend: Arc<dyn Backend> = FakeController::new(FakeConfig {
        namespaces: vec![NamespaceConfig::null(1 << 40, 512)],
        exec: ExecMode::Sync,
        ..FakeConfig::default()
    })
    .expect("fake controller");
    let ctrl = Controller::new(backend, ControllerOptions::default()).expect("controller");
    let qp = ctrl
        .create_qpair(QpairOptions {
            depth: q as u16,
            ..Default::default()
        })
        .expect("queue pair");
    let aq = if caller {
        AsyncQueue::caller_driven(qp).expect("an idle queue pair")
    } else {
        AsyncQueue::new(qp).expect("an idle queue pair")
    };
    let per = n / q as u64;
    let flags: Vec<Arc<Flag>> = (0..q)
        .map(|_| Arc::new(Flag(AtomicBool::new(true))))
        .collect();
    let wakers: Vec<Waker> = flags.iter().map(|f| Waker::from(f.clone())).collect();
    let mut tasks: Vec<Option<Pin<Box<dyn Future<Output = u64> + '_>>>> = (0..q)
        .map(|i| {
            let buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buffer");
            let t: Pin<Box<dyn Future<Output = u64> + '_>> =
                Box::pin(reader(&aq, buf, i as u64 * per, per));
            Some(t)
        })
        .collect();
    let start = Instant::now();
    let mut left = q;
    let mut total = 0u64;
    let mut polls = 0u64;
    while left > 0 {
        if caller {
            aq.drive().expect("drive");
        }
        for i in 0..q {
            if !flags[i].0.swap(false, Ordering::AcqRel) {
                continue;
            }
            let Some(t) = tasks[i].as_mut() else {
                continue;
            };
            polls += 1;
            if let Poll::Ready(k) = t.as_mut().poll(&mut Context::from_waker(&wakers[i])) {
                total += k;
                tasks[i] = None;
                left -= 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(tasks);
    aq.close().expect("close");
    println!(
        "{} reads, QD{q}, {}: {:.0} IOPS, {:.2} task polls per I/O",
        total,
        if caller { "caller_driven" } else { "new" },
        total as f64 / secs,
        polls as f64 / total as f64
    );
}
