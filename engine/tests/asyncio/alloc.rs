//! The async driver allocates nothing per I/O (issue 26 item 3 a): the
//! same reads, eight at a time, through the queue pair's own API and
//! through `AsyncQueue` futures make the same number of allocations on
//! this thread (the fake's own, in its synchronous mode, included in both).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use mcqio::{AsyncQueue, DmaBuf, IoFuture, QpairOptions, QueuePair};
use mcqio_fixtures::testing::engine::nvme;
use mcqio_fixtures::ExecMode;

/// Counts this thread's allocations.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to `System` unchanged; the counter is a
// const-initialised thread-local `Cell`, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `l` is `System`'s.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

const AT_ONCE: usize = 8;
const IOS: u64 = 2000;

/// `IOS` one-block reads, `AT_ONCE` outstanding, through the queue pair.
fn direct(qp: &mut QueuePair, bufs: &mut Vec<DmaBuf>) -> u64 {
    let before = allocs();
    let mut issued = 0u64;
    let mut done = 0u64;
    while done < IOS {
        while issued < IOS && !bufs.is_empty() {
            let b = bufs.pop().unwrap();
            qp.read(1, issued % 64, 1, b, issued).unwrap();
            issued += 1;
        }
        qp.submit();
        qp.poll(AT_ONCE, |c| {
            c.result.unwrap();
            bufs.push(c.buf.unwrap());
            done += 1;
        })
        .unwrap();
    }
    allocs() - before
}

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// The same reads as futures, polled round-robin from a fixed array.
fn futures(aq: &AsyncQueue<QueuePair>, bufs: &mut Vec<DmaBuf>, waker: &Waker) -> u64 {
    let mut cx = Context::from_waker(waker);
    let mut live: [Option<IoFuture<'_, QueuePair>>; AT_ONCE] = std::array::from_fn(|_| None);
    let before = allocs();
    let mut issued = 0u64;
    let mut done = 0u64;
    while done < IOS {
        for f in live.iter_mut() {
            if f.is_none() && issued < IOS {
                *f = Some(aq.read(1u32, issued % 64, 1, bufs.pop().unwrap()));
                issued += 1;
            }
            if let Some(fut) = f {
                if let Poll::Ready(o) = Pin::new(fut).poll(&mut cx) {
                    let c = o.map_err(|e| e.kind).unwrap();
                    c.result.unwrap();
                    bufs.push(c.buf.unwrap());
                    *f = None;
                    done += 1;
                }
            }
        }
    }
    allocs() - before
}

#[test]
fn futures_allocate_nothing_per_io() {
    let (_fake, ctrl) = nvme::open(nvme::config(ExecMode::Sync, 5));
    let mut bufs: Vec<DmaBuf> = (0..AT_ONCE).map(|_| nvme::buf(&ctrl, 512)).collect();
    bufs.reserve(AT_ONCE);
    let opts = QpairOptions {
        depth: 16,
        ..Default::default()
    };
    let mut qp = ctrl.create_qpair(opts.clone()).unwrap();
    direct(&mut qp, &mut bufs); // warm up
    let base = direct(&mut qp, &mut bufs);
    qp.close(|_| ()).unwrap();

    let aq = AsyncQueue::new(ctrl.create_qpair(opts).unwrap()).expect("an idle queue pair");
    let waker = Waker::from(Arc::new(Noop));
    futures(&aq, &mut bufs, &waker); // warm up
    let with_futures = futures(&aq, &mut bufs, &waker);
    assert_eq!(
        with_futures, base,
        "{IOS} reads: {base} allocations through the queue pair, {with_futures} through futures"
    );
    aq.close().unwrap();
}
