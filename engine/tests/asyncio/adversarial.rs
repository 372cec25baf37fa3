//! The async driver under adversarial executors (issue 39 item 7): a
//! scripted executor drives N futures (reads, writes, flushes; random
//! sizes; more futures than slots) over the NVMe fake with random device
//! delays. It polls only woken tasks, in a random order each round; drops
//! some futures mid-flight; abandons some (alive, never polled until the
//! end, as a `select!` leaves `&mut fut` when another branch wins); moves
//! some to another task's waker; and injects a controller reset or a
//! controller failure at a random round. Then it checks:
//!
//! - every future that was not dropped resolves exactly once, with its
//!   own buffer and, for a read that succeeded, its own block's data; an
//!   abandoned one resolves when it is finally polled;
//! - no waker is lost: while a live, non-abandoned future is unresolved,
//!   some task is woken (a lost wake-up would leave the executor with no
//!   task to poll);
//! - a dropped future's buffer stays with the queue until its completion
//!   (the fake's IOMMU sees no access to freed memory, and every buffer is
//!   released once everything ended);
//! - writes that succeeded are on the medium.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::{AsyncQueue, IoError, QpairOptions, SubmitErrorKind};
use mcqio_fixtures::testing::engine::asyncio::{Flag, Tracked};
use mcqio_fixtures::testing::engine::nvme;
use mcqio_fixtures::{ExecMode, Fault};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::Rng;

const HANG: Duration = Duration::from_secs(20);
/// Blocks of 512 bytes each future's region spans (its LBA range).
const REGION: u64 = 16;

fn pattern(id: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (id * 37 + k * 11) as u8 ^ 0xc3).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Read,
    Write,
    Flush,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    /// Polled whenever woken until it resolves.
    Normal,
    /// Dropped after this many polls (if still pending).
    Drop(u32),
    /// Left alive and unpolled after this many polls, until the end.
    Abandon(u32),
    /// Its task moves to another waker after this many polls.
    Move(u32),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Event {
    None,
    Reset,
    Fatal,
}

type Out = (
    usize,
    Op,
    Result<Option<(Result<(), IoError>, Option<Tracked>)>, SubmitErrorKind>,
);
type Task<'a> = Pin<Box<dyn Future<Output = Out> + 'a>>;

struct Script {
    ops: Vec<(Op, u32, Fate)>,
    event: Event,
    event_round: usize,
    caller: bool,
    depth: u16,
    exec: ExecMode,
    seed: u64,
}

fn run(s: Script) {
    let (fake, ctrl) = nvme::open(nvme::config(s.exec.clone(), 5));
    fake.faults()
        .set_probability(Fault::Delay(Duration::from_micros(300)), 0.3);
    let mut rng = nvme::rng(s.seed);
    let n = s.ops.len();
    // The reads' blocks, written first through a queue pair of their own.
    {
        let mut side = ctrl.create_qpair(QpairOptions::default()).unwrap();
        for (i, &(op, blocks, _)) in s.ops.iter().enumerate() {
            if op == Op::Read {
                let len = blocks as usize * 512;
                let mut b = nvme::buf(&ctrl, len);
                b.write_at(0, &pattern(i, len)).unwrap();
                side.write(1u32, i as u64 * REGION, blocks, b, 0).unwrap();
                BlockQueue::submit(&mut side);
                nvme::wait_n(&mut side, 1)[0].result.unwrap();
            }
        }
        side.close(drop).unwrap();
    }
    let qp = ctrl
        .create_qpair_for::<Tracked>(QpairOptions {
            depth: s.depth,
            io_timeout: None,
            ..Default::default()
        })
        .unwrap();
    let aq = if s.caller {
        AsyncQueue::caller_driven(qp).unwrap()
    } else {
        AsyncQueue::new(qp).unwrap()
    };
    let mut released = Vec::new();
    let mut tasks: Vec<Option<Task<'_>>> = Vec::new();
    for (i, &(op, blocks, _)) in s.ops.iter().enumerate() {
        let len = blocks as usize * 512;
        let mut b = nvme::buf(&ctrl, len);
        if op == Op::Write {
            b.write_at(0, &pattern(i, len)).unwrap();
        }
        let (buf, flag) = Tracked::new(b, i);
        released.push(flag);
        let lba = i as u64 * REGION;
        let aq = &aq;
        let t: Task<'_> = match op {
            Op::Read | Op::Write => Box::pin(async move {
                let f = if op == Op::Read {
                    aq.read(1u32, lba, blocks, buf)
                } else {
                    aq.write(1u32, lba, blocks, buf)
                };
                let r = match f.await {
                    Ok(c) => Ok(Some((c.result, c.buf))),
                    Err(e) => {
                        assert_eq!(e.buf.id, i, "a refusal hands back the future's own buffer");
                        Err(e.kind)
                    }
                };
                (i, op, r)
            }),
            Op::Flush => {
                drop(buf);
                Box::pin(async move {
                    let r = match aq.flush(1u32).await {
                        Ok(c) => Ok(Some((c.result, None))),
                        Err(e) => Err(e.kind),
                    };
                    (i, op, r)
                })
            }
        };
        tasks.push(Some(t));
    }
    // Two wakers per task: its own, and the one it moves to.
    let flags: Vec<[Arc<Flag>; 2]> = (0..n)
        .map(|_| {
            [
                Arc::new(Flag(AtomicBool::new(true))),
                Arc::new(Flag(AtomicBool::new(false))),
            ]
        })
        .collect();
    let wakers: Vec<[Waker; 2]> = flags
        .iter()
        .map(|f| [Waker::from(f[0].clone()), Waker::from(f[1].clone())])
        .collect();
    let mut which = vec![0usize; n];
    let mut polls = vec![0u32; n];
    let mut abandoned = vec![false; n];
    let mut outs: Vec<Option<Out>> = (0..n).map(|_| None).collect();
    let mut dropped = vec![false; n];
    let start = Instant::now();
    let mut round = 0usize;
    let mut order: Vec<usize> = (0..n).collect();
    let live = |outs: &[Option<Out>], dropped: &[bool], abandoned: &[bool]| {
        (0..n).any(|i| outs[i].is_none() && !dropped[i] && !abandoned[i])
    };
    let mut idle_since: Option<Instant> = None;
    while live(&outs, &dropped, &abandoned) {
        round += 1;
        if round == s.event_round {
            match s.event {
                Event::None => {}
                Event::Reset => ctrl.reset().unwrap(),
                Event::Fatal => fake.set_fatal(),
            }
        }
        fake.poll();
        if s.caller {
            let _ = aq.drive();
        }
        order.shuffle(&mut rng);
        let mut any = false;
        for &i in &order {
            if outs[i].is_some() || dropped[i] || abandoned[i] {
                continue;
            }
            if !flags[i][which[i]].0.swap(false, Ordering::AcqRel) {
                continue;
            }
            any = true;
            let t = tasks[i].as_mut().unwrap();
            let cx = &mut Context::from_waker(&wakers[i][which[i]]);
            polls[i] += 1;
            if let Poll::Ready(o) = t.as_mut().poll(cx) {
                outs[i] = Some(o);
                tasks[i] = None;
                continue;
            }
            match s.ops[i].2 {
                Fate::Drop(k) if polls[i] >= k => {
                    tasks[i] = None;
                    dropped[i] = true;
                }
                Fate::Abandon(k) if polls[i] >= k => abandoned[i] = true,
                Fate::Move(k) if polls[i] == k => {
                    // The old waker may still fire; only the new one counts.
                    which[i] = 1;
                    flags[i][1].0.store(true, Ordering::Release);
                }
                _ => {}
            }
        }
        if any {
            idle_since = None;
        } else {
            // No task woken: fine while a delayed completion is on its way
            // (caller-driven: `drive` wakes it), a lost wake-up if it lasts.
            let since = *idle_since.get_or_insert_with(Instant::now);
            assert!(
                since.elapsed() < HANG,
                "no task woken for {HANG:?} with live futures unresolved: a lost wake-up \
                 (round {round}, {:?})",
                (0..n)
                    .filter(|&i| outs[i].is_none() && !dropped[i] && !abandoned[i])
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_micros(50));
        }
        assert!(start.elapsed() < 3 * HANG, "the script did not finish");
        if rng.gen_bool(0.05) {
            std::thread::yield_now();
        }
    }
    // The abandoned futures come back: each resolves once polled, driving
    // the queue itself if it has to.
    for i in 0..n {
        if !abandoned[i] {
            continue;
        }
        let t = tasks[i].as_mut().unwrap();
        let cx = &mut Context::from_waker(&wakers[i][which[i]]);
        let begun = Instant::now();
        loop {
            fake.poll();
            if s.caller {
                let _ = aq.drive();
            }
            if let Poll::Ready(o) = t.as_mut().poll(cx) {
                outs[i] = Some(o);
                tasks[i] = None;
                break;
            }
            assert!(
                begun.elapsed() < HANG,
                "abandoned future {i} never resolved"
            );
            std::thread::yield_now();
        }
    }
    // Check every outcome.
    let mut written = Vec::new();
    for (i, o) in outs.iter_mut().enumerate() {
        let Some((id, op, r)) = o.take() else {
            assert!(dropped[i], "future {i} neither resolved nor dropped");
            continue;
        };
        assert_eq!(id, i);
        assert_eq!(op, s.ops[i].0);
        match r {
            Ok(Some((result, buf))) => {
                if op != Op::Flush {
                    let b = buf.expect("a completion hands the buffer back");
                    assert_eq!(b.id, i, "future {i} got another future's buffer");
                    if result.is_ok() && op == Op::Read {
                        let mut back = vec![0u8; b.buf.len()];
                        b.buf.read_at(0, &mut back).unwrap();
                        assert_eq!(
                            back,
                            pattern(i, back.len()),
                            "future {i} read another block"
                        );
                    }
                }
                match result {
                    Ok(()) => {
                        if op == Op::Write {
                            written.push(i);
                        }
                    }
                    Err(IoError::AbortedByReset) => assert_eq!(s.event, Event::Reset),
                    Err(IoError::ControllerFailed) => assert_eq!(s.event, Event::Fatal),
                    Err(e) => panic!("future {i}: {e}"),
                }
            }
            Ok(None) => unreachable!(),
            Err(kind) => match kind {
                SubmitErrorKind::ControllerFailed => assert_eq!(s.event, Event::Fatal),
                other => panic!("future {i} refused: {other:?}"),
            },
        }
    }
    // What the dropped futures left ends; then every buffer is released.
    let begun = Instant::now();
    while aq.in_flight() > 0 {
        fake.poll();
        let _ = aq.drive();
        assert!(begun.elapsed() < HANG, "abandoned commands did not end");
        std::thread::yield_now();
    }
    drop(tasks);
    assert!(aq.take_strays().is_empty());
    let _ = aq.close();
    for (i, r) in released.iter().enumerate() {
        assert!(r.load(Ordering::Acquire), "buffer {i} never released");
    }
    assert_eq!(fake.stats().iommu_faults, 0);
    assert!(fake.iommu().mapped_but_freed().is_empty());
    // Writes that succeeded are on the medium.
    if s.event != Event::Fatal {
        let mut side = ctrl.create_qpair(QpairOptions::default()).unwrap();
        for i in written {
            let blocks = s.ops[i].1;
            let len = blocks as usize * 512;
            side.read(1u32, i as u64 * REGION, blocks, nvme::buf(&ctrl, len), 0)
                .unwrap();
            BlockQueue::submit(&mut side);
            let c = nvme::wait_n(&mut side, 1).pop().unwrap();
            c.result.unwrap();
            let mut back = vec![0u8; len];
            c.buf.unwrap().read_at(0, &mut back).unwrap();
            assert_eq!(back, pattern(i, len), "write {i} not on the medium");
        }
        side.close(drop).unwrap();
    }
}

fn script(seed: u64, n: usize, depth: u16, caller: bool, event: u8, exec: ExecMode) -> Script {
    let mut rng = nvme::rng(seed);
    // An abandoned future whose command completed keeps its slot (and
    // the completion) until it is polled again, as a task holding a
    // permit would: at most depth - 1 of them, so the others can go on.
    let mut abandons = depth.saturating_sub(1);
    let ops = (0..n)
        .map(|_| {
            let op = match rng.gen_range(0..10) {
                0 => Op::Flush,
                1..=5 => Op::Read,
                _ => Op::Write,
            };
            let blocks = rng.gen_range(1..=REGION as u32);
            let k = rng.gen_range(1..=4);
            let fate = match rng.gen_range(0..10) {
                0 | 1 => Fate::Drop(k),
                2 | 3 if abandons > 0 => {
                    abandons -= 1;
                    Fate::Abandon(k)
                }
                4 => Fate::Move(k),
                _ => Fate::Normal,
            };
            (op, blocks, fate)
        })
        .collect();
    Script {
        ops,
        event: match event {
            0 => Event::Reset,
            1 => Event::Fatal,
            _ => Event::None,
        },
        event_round: rng.gen_range(2..40),
        caller,
        depth,
        exec,
        seed,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn futures_under_an_adversarial_executor(
        seed in any::<u64>(),
        n in 2usize..24,
        depth in 1u16..8,
        caller in any::<bool>(),
        event in 0u8..4,
    ) {
        run(script(seed, n, depth, caller, event, ExecMode::Sync));
    }
}

/// The same with the device on threads of its own (completions arrive
/// while the executor runs), a few fixed seeds.
#[test]
fn futures_under_an_adversarial_executor_with_a_threaded_device() {
    for seed in 0..6u64 {
        let exec = ExecMode::Threaded {
            workers: 2,
            pin_core: None,
        };
        run(script(seed, 20, 4, seed % 2 == 1, (seed % 4) as u8, exec));
    }
}
