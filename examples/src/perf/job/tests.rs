//! The job loop end to end, on an in-memory queue.

use std::ptr::NonNull;
use std::time::Duration;

use super::*;
use crate::queue::{Failure, IoReq, IoStatus, PushError};
use crate::workload::{IoGen, Op};

/// An in-memory device: every pushed I/O completes at the next reap.
struct MemQueue {
    lbads: usize,
    bufs: Vec<Vec<u64>>,
    disk: std::collections::HashMap<u64, Vec<u8>>,
    pending: Vec<(usize, IoReq)>,
    /// Flip a byte of every n-th read (0: never).
    corrupt_every: u64,
    reads: u64,
}

impl MemQueue {
    fn new(depth: usize, buf_len: usize, lbads: usize) -> Self {
        MemQueue {
            lbads,
            bufs: (0..depth).map(|_| vec![0u64; buf_len / 8]).collect(),
            disk: Default::default(),
            pending: Vec::new(),
            corrupt_every: 0,
            reads: 0,
        }
    }
}

impl JobQueue for MemQueue {
    fn depth(&self) -> usize {
        self.bufs.len()
    }
    fn buffer_len(&self) -> usize {
        self.bufs[0].len() * 8
    }
    fn buffer(&self, slot: usize) -> NonNull<u8> {
        NonNull::new(self.bufs[slot].as_ptr() as *mut u8).unwrap()
    }
    fn push(&mut self, slot: usize, req: IoReq) -> Result<(), PushError> {
        self.pending.push((slot, req));
        Ok(())
    }
    fn submit(&mut self, _inflight: usize) -> Result<(), QueueError> {
        Ok(())
    }
    fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
        let n = self.pending.len();
        for (slot, req) in std::mem::take(&mut self.pending) {
            let lb = self.lbads;
            // SAFETY: test double; the buffer is a live, exclusively borrowed Vec<u64>
            // of len()*8 bytes, viewed as bytes (u8 has no alignment needs).
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(
                    self.bufs[slot].as_mut_ptr().cast::<u8>(),
                    self.bufs[slot].len() * 8,
                )
            };
            for b in 0..req.nlb as usize {
                let blk = &mut bytes[b * lb..(b + 1) * lb];
                match req.op {
                    Op::Write => {
                        self.disk.insert(req.slba + b as u64, blk.to_vec());
                    }
                    Op::Read => match self.disk.get(&(req.slba + b as u64)) {
                        Some(d) => blk.copy_from_slice(d),
                        None => blk.fill(0),
                    },
                }
            }
            if req.op == Op::Read {
                self.reads += 1;
                if self.corrupt_every > 0 && self.reads % self.corrupt_every == 0 {
                    bytes[100] ^= 0x40;
                }
            }
            let status = if req.slba == 13 && req.op == Op::Write {
                IoStatus::Failed(Failure::Errno(libc::EIO))
            } else {
                IoStatus::Ok
            };
            done(slot, status);
        }
        Ok(n)
    }
}

fn spec(verify: bool, ios: u64) -> JobSpec {
    JobSpec {
        index: 0,
        thread: 0,
        nsid: 1,
        first_lba: 0,
        blocks: 64,
        nlb: 2,
        seq_start: 0,
        lbads: 512,
        pattern: Pattern::Randrw,
        read_pct: 50,
        depth: 8,
        ios_limit: Some(ios),
        seed: 99,
        verify,
        histogram: true,
        dma: crate::queue::DmaMode::Premapped,
        dma_batch: None,
        distribution: Distribution::Uniform,
        rate_iops: None,
        wait: mcqio::WaitPolicy::Poll,
        poll_pause: PauseRule::Always,
    }
}

fn go(q: MemQueue, spec: &JobSpec) -> JobResult {
    let shared = Shared::new(1);
    shared.phase.store(PHASE_MEASURE, Ordering::Release);
    let mut ready = None;
    let r = run(q, spec, &shared, Clock::instant(), |r| ready = Some(r)).unwrap();
    assert_eq!(ready, Some(Ok(())));
    assert_eq!(shared.finished.load(Ordering::Acquire), 1);
    r
}

/// A job whose thread first looks at the phase after
/// the run already said STOP must return, not spin with no I/O limit.
#[test]
fn a_job_that_starts_after_stop_returns() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = spec(false, 1);
        s.ios_limit = None;
        let shared = Shared::new(1);
        shared.phase.store(PHASE_STOP, Ordering::Release);
        let r = run(
            MemQueue::new(8, 1024, 512),
            &s,
            &shared,
            Clock::instant(),
            |_| {},
        );
        let _ = tx.send(r.map(|r| r.ios).map_err(|e| e.to_string()));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    assert_eq!(got, Ok(Ok(0)), "the job did not return after STOP");
}

#[test]
fn counts_exactly_n_ios_and_records_each_in_the_histogram() {
    let s = spec(false, 1000);
    let r = go(MemQueue::new(8, 1024, 512), &s);
    assert_eq!(r.ios, 1000);
    let [rd, wr] = &r.dir;
    assert_eq!(rd.ios + wr.ios, 1000);
    assert!(rd.ios > 300 && wr.ios > 300, "{} {}", rd.ios, wr.ios);
    assert_eq!(
        r.hist().unwrap().len(),
        1000,
        "batched records still count every I/O"
    );
    let (_, min, max) = r.lat_ns();
    assert!(min <= max);
}

/// The job counts its latency-clock reads — one at each push
/// and one at each completion, none per batch without a rate limit —
/// and a queue that is not on the engine reports no register accesses.
#[test]
fn the_job_counts_two_clock_reads_per_io() {
    let r = go(MemQueue::new(8, 1024, 512), &spec(false, 1000));
    assert_eq!(r.ios, 1000);
    assert_eq!(r.clock_reads, 2000);
    assert_eq!(r.accesses, None);
}

/// Reads and writes are counted and timed apart, each
/// with its own histogram.
#[test]
fn reads_and_writes_have_their_own_counters_and_histograms() {
    let s = spec(false, 2000);
    let r = go(MemQueue::new(8, 1024, 512), &s);
    let [rd, wr] = &r.dir;
    assert_eq!(rd.hist.as_ref().unwrap().len(), rd.ios);
    assert_eq!(wr.hist.as_ref().unwrap().len(), wr.ios);
    assert!(rd.ios > 0 && wr.ios > 0);
    assert!(rd.lat_min_ns <= rd.lat_max_ns && wr.lat_min_ns <= wr.lat_max_ns);
    let mut s = spec(false, 500);
    s.read_pct = 100;
    s.pattern = Pattern::Randread;
    let r = go(MemQueue::new(8, 1024, 512), &s);
    assert_eq!((r.dir[0].ios, r.dir[1].ios), (500, 0));
    assert_eq!(r.dir[1].hist.as_ref().unwrap().len(), 0);
}

/// On each controller tick the job copies its
/// cumulative histogram, tagged with the tick.
#[test]
fn a_tick_snapshots_the_histogram() {
    let mut s = spec(false, 1);
    s.ios_limit = None;
    let shared = std::sync::Arc::new(Shared::new(1));
    shared.phase.store(PHASE_MEASURE, Ordering::Release);
    let sh = std::sync::Arc::clone(&shared);
    let h = std::thread::spawn(move || {
        run(
            MemQueue::new(8, 1024, 512),
            &s,
            &sh,
            Clock::instant(),
            |_| {},
        )
        .unwrap()
    });
    while shared.completed[0].load(Ordering::Relaxed) < 100 {
        std::thread::yield_now();
    }
    shared.tick.store(1, Ordering::Relaxed);
    let seen = shared.completed[0].load(Ordering::Relaxed);
    while shared.completed[0].load(Ordering::Relaxed) < seen + 1000 {
        std::thread::yield_now();
    }
    shared.phase.store(PHASE_STOP, Ordering::Release);
    let r = h.join().unwrap();
    assert_eq!(r.snapshots.len(), 1);
    let (k, snap) = &r.snapshots[0];
    assert_eq!(*k, 1);
    let n: u64 = snap.iter().map(|(_, c)| c).sum();
    assert!(n >= 100 && n < r.ios, "{n} {}", r.ios);
}

/// A rate limit spaces I/O starts by the clock: with
/// a clock that never advances, only the first I/O may start.
#[test]
fn rate_limit_holds_back_ios_until_their_time() {
    let mut s = spec(false, 10);
    s.rate_iops = Some(1);
    let shared = Shared::new(1);
    shared.phase.store(PHASE_MEASURE, Ordering::Release);
    let mut r =
        Runner::<MemQueue, false, false>::new(MemQueue::new(8, 1024, 512), &s, Clock::instant());
    r.rate_ticks = 1_000_000_000;
    r.rate_next = r.clock.now();
    let mut gen = IoGen::new(Pattern::Randread, 100, 0, 64, 2, 0, 1);
    let mut budget = 10;
    r.fill(&mut gen, &mut budget).unwrap();
    r.fill(&mut gen, &mut budget).unwrap();
    assert_eq!((r.st.inflight(), budget), (1, 9), "one I/O per second");
    // Its time comes: exactly one more may start.
    r.rate_next = r.clock.now();
    r.fill(&mut gen, &mut budget).unwrap();
    assert_eq!((r.st.inflight(), budget), (2, 8));
    drop(shared);
}

/// A stall (the job or the device descheduled) must not
/// cost the run its rate. A job 100 intervals behind its schedule, with
/// 8 slots, starts 8 I/Os now and keeps the other 92 due, so they start
/// as soon as slots free, rather than forgetting them (the old floor of
/// one queue's worth, which on a busy machine left `--rate-iops 100000`
/// at 94-98 % with no way to catch up).
#[test]
fn a_paced_job_behind_its_schedule_keeps_what_it_owes() {
    let mut s = spec(false, 1000);
    s.rate_iops = Some(1000);
    let shared = Shared::new(1);
    shared.phase.store(PHASE_MEASURE, Ordering::Release);
    let mut r = Runner::<MemQueue, false, false>::new(
        MemQueue::new(8, 1024, 512),
        &s,
        // A clock whose count is already past two minutes, so a schedule
        // can be put in the past.
        Clock::instant_since(
            std::time::Instant::now()
                .checked_sub(std::time::Duration::from_secs(120))
                .expect("the monotonic clock is older than two minutes"),
        ),
    );
    r.set_rate(1000);
    let ticks = r.rate_ticks;
    assert_eq!(
        ticks, 1_000_000,
        "1000 I/Os per second on a nanosecond clock"
    );
    // 100 intervals behind.
    r.rate_next = r.clock.now() - 100 * ticks;
    let mut gen = IoGen::new(Pattern::Randread, 100, 0, 64, 2, 0, 1);
    let mut budget = 1000;
    r.fill(&mut gen, &mut budget).unwrap();
    assert_eq!(r.st.inflight(), 8, "every free slot starts at once");
    let behind = (r.clock.now() - r.rate_next) / ticks;
    assert!(
        behind >= 91,
        "the remaining ~92 due I/Os stay due: {behind} intervals behind"
    );
    // A stall longer than the catch-up window (one second of the rate,
    // or a queue's worth if that is more) is forgiven beyond it: the
    // shortfall shows in the achieved rate and its warning instead of
    // a burst of a whole minute's I/Os.
    r.turn().unwrap();
    r.rate_next = r.clock.now() - 60_000 * ticks;
    r.fill(&mut gen, &mut budget).unwrap();
    let behind = (r.clock.now() - r.rate_next) / ticks;
    assert!((990..=1001).contains(&behind), "{behind} intervals behind");
    drop(shared);
}

#[test]
fn verify_passes_on_a_faithful_device_and_catches_corruption() {
    let s = spec(true, 2000);
    let r = go(MemQueue::new(8, 1024, 512), &s);
    // LBA 13 is never the start of a 2-block I/O (positions are even), so no errors.
    assert_eq!((r.errors, r.verify_mismatches), (0, 0), "{:?}", r.failures);
    assert!(r.verified_blocks > 0);
    assert_eq!(r.prefill_blocks, 64);

    let mut q = MemQueue::new(8, 1024, 512);
    q.corrupt_every = 7;
    let r = go(q, &s);
    assert!(r.verify_mismatches > 0);
    assert!(r.failures[0].contains("verify: LBA"), "{}", r.failures[0]);
    assert!(
        r.failures[0].contains("payload differs at byte 100"),
        "{}",
        r.failures[0]
    );
}

/// A queue pair that ends its first command without the buffer (as a
/// failed reset or an unconfirmed withdrawal does: the device may
/// still write it) and completes every other at the next poll. It
/// counts submissions that hand the device the lost buffer again.
struct LosingQueue {
    pending: Vec<mcqio::Completion<crate::slots::SlotBuf>>,
    lost: Option<mcqio_vfio::Iova>,
    reused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl LosingQueue {
    fn take(&mut self, buf: crate::slots::SlotBuf, tag: u64) {
        match self.lost {
            Some(l) => {
                if buf.iova() == l {
                    self.reused.fetch_add(1, Ordering::Relaxed);
                }
                self.pending.push(mcqio::Completion {
                    tag,
                    result: Ok(()),
                    buf: Some(buf),
                    dw0: 0,
                });
            }
            None => {
                self.lost = Some(buf.iova());
                self.pending.push(mcqio::Completion {
                    tag,
                    result: Err(mcqio::IoError::TimedOut),
                    buf: None,
                    dw0: 0,
                });
            }
        }
    }
}

impl mcqio::core::block::BlockQueue for LosingQueue {
    type Addr = u32;
    type Buf = crate::slots::SlotBuf;
    fn read(
        &mut self,
        _: u32,
        _: u64,
        _: u32,
        buf: Self::Buf,
        tag: u64,
    ) -> Result<(), mcqio::SubmitError<Self::Buf>> {
        self.take(buf, tag);
        Ok(())
    }
    fn write(
        &mut self,
        _: u32,
        _: u64,
        _: u32,
        buf: Self::Buf,
        tag: u64,
    ) -> Result<(), mcqio::SubmitError<Self::Buf>> {
        self.take(buf, tag);
        Ok(())
    }
    fn flush(&mut self, _: u32, _: u64) -> Result<(), mcqio::SubmitError<()>> {
        unreachable!("the job never flushes")
    }
    fn deallocate(&mut self, _: u32, _: u64, _: u32, _: u64) -> Result<(), mcqio::SubmitError<()>> {
        unreachable!("the job never trims")
    }
    fn submit(&mut self) -> bool {
        true
    }
    fn poll<F: FnMut(mcqio::Completion<Self::Buf>)>(
        &mut self,
        max: usize,
        mut f: F,
    ) -> mcqio::Result<usize> {
        let n = max.min(self.pending.len());
        for c in self.pending.drain(..n) {
            f(c);
        }
        Ok(n)
    }
    fn depth(&self) -> usize {
        64
    }
    fn outstanding(&self) -> usize {
        self.pending.len()
    }
    fn max_transfer(&self) -> u64 {
        1 << 20
    }
    fn block_shift(&self, _: u32) -> Option<u32> {
        Some(9)
    }
    fn close<F: FnMut(mcqio::Completion<Self::Buf>)>(mut self, f: F) -> mcqio::Result<()> {
        self.poll(usize::MAX, f).map(|_| ())
    }
}

/// A completion without its buffer means the device
/// may still write that slot's memory; the job must never put the slot
/// back in use (and the region is leaked at the end).
#[test]
fn a_slot_whose_buffer_did_not_come_back_is_never_reused() {
    let fake =
        mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync()).expect("fake");
    let space = mcqio_vfio::Backend::dma(&*fake).clone();
    for verify in [false, true] {
        let s = spec(verify, 200);
        let mem = crate::slots::SlotBuffers::alloc(&space, s.depth, 1024).expect("buffers");
        let reused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let q = crate::slots::BlockJobQueue::new(
            LosingQueue {
                pending: Vec::new(),
                lost: None,
                reused: reused.clone(),
            },
            1,
            mem,
        );
        let mapped = fake.iommu().mapping_count();
        let r = go_with(q, &s);
        assert_eq!(
            reused.load(Ordering::Relaxed),
            0,
            "verify={verify}: the lost slot's buffer went to the device again"
        );
        assert_eq!(r.errors, 1, "verify={verify}: {:?}", r.failures);
        assert!(
            r.failures[0].contains("did not come back"),
            "{}",
            r.failures[0]
        );
        assert_eq!(
            fake.iommu().mapping_count(),
            mapped,
            "verify={verify}: the region was unmapped"
        );
    }
}

/// A job whose every slot's buffer is lost stops with an error instead
/// of waiting for a free slot forever.
#[test]
fn a_job_that_lost_every_slot_stops() {
    struct AllLost(Vec<usize>);
    impl JobQueue for AllLost {
        fn depth(&self) -> usize {
            2
        }
        fn buffer_len(&self) -> usize {
            1024
        }
        fn buffer(&self, _: usize) -> NonNull<u8> {
            NonNull::dangling()
        }
        fn push(&mut self, slot: usize, _: IoReq) -> Result<(), PushError> {
            self.0.push(slot);
            Ok(())
        }
        fn submit(&mut self, _: usize) -> Result<(), QueueError> {
            Ok(())
        }
        fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
            let n = self.0.len();
            for slot in self.0.drain(..) {
                done(
                    slot,
                    IoStatus::Lost(Failure::Host(mcqio::IoError::TimedOut)),
                );
            }
            Ok(n)
        }
    }
    let mut s = spec(false, 100);
    s.depth = 2;
    let shared = Shared::new(1);
    shared.phase.store(PHASE_MEASURE, Ordering::Release);
    let e = run(AllLost(Vec::new()), &s, &shared, Clock::instant(), |_| {}).unwrap_err();
    assert!(e.to_string().contains("every slot"), "{e}");
}

fn go_with<Q: JobQueue>(q: Q, spec: &JobSpec) -> JobResult {
    let shared = Shared::new(1);
    shared.phase.store(PHASE_MEASURE, Ordering::Release);
    let mut ready = None;
    let r = run(q, spec, &shared, Clock::instant(), |r| ready = Some(r)).unwrap();
    assert_eq!(ready, Some(Ok(())));
    r
}

/// Spin for `d` on the monotonic clock (the test queue's own pace).
fn spin(d: Duration) {
    let t = std::time::Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Each I/O carries its own submit and completion
/// stamps. The queue takes 2 µs per push and 7 µs per completion, so
/// the k-th I/O of a batch waits about 5k µs longer than the first:
/// with one stamp per batch and one per poll they all got the same
/// latency, and the histogram held one value per batch.
#[test]
fn every_io_gets_its_own_latency() {
    struct Paced(Vec<usize>);
    impl JobQueue for Paced {
        fn depth(&self) -> usize {
            8
        }
        fn buffer_len(&self) -> usize {
            1024
        }
        fn buffer(&self, _: usize) -> NonNull<u8> {
            NonNull::dangling()
        }
        fn push(&mut self, slot: usize, _: IoReq) -> Result<(), PushError> {
            spin(Duration::from_micros(2));
            self.0.push(slot);
            Ok(())
        }
        fn submit(&mut self, _: usize) -> Result<(), QueueError> {
            Ok(())
        }
        fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
            let n = self.0.len();
            for slot in self.0.drain(..) {
                spin(Duration::from_micros(7));
                done(slot, IoStatus::Ok);
            }
            Ok(n)
        }
    }
    let mut s = spec(false, 400);
    s.read_pct = 100;
    s.pattern = Pattern::Randread;
    let r = go_with(Paced(Vec::new()), &s);
    let h = r.hist().expect("histogram");
    assert_eq!(h.len(), 400);
    // Per I/O the k-th of a batch takes about 21 + 5k µs, so the middle
    // half spans about 15 µs; one stamp per batch gave every I/O the
    // same value, and only scheduling noise between batches apart.
    let (p25, p75) = (h.value_at_quantile(0.25), h.value_at_quantile(0.75));
    assert!(
        p75 - p25 >= 8_000,
        "p25 {p25} ns, p75 {p75} ns: the I/Os of a batch share one latency"
    );
}

#[test]
fn failed_ios_are_counted_and_described() {
    let mut s = spec(false, 500);
    s.nlb = 1;
    s.read_pct = 0;
    s.pattern = Pattern::Write;
    let r = go(MemQueue::new(8, 512, 512), &s);
    // Sequential writes over 64 blocks hit LBA 13 every 64 I/Os.
    assert_eq!(r.errors, 500 / 64 + u64::from(500 % 64 > 13));
    assert!(
        r.failures[0].contains("Write of 1 blocks at LBA 13 failed"),
        "{}",
        r.failures[0]
    );
}
