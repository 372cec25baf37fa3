//! Under random device faults (duplicate and corrupt-CID completions,
//! delays that reorder completions, error statuses), every submitted command
//! is delivered exactly once — by `poll`, or by `close` for commands whose
//! completion the device lost — and never to the wrong tag.

use mcqio_fixtures::testing::engine::nvme as common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use mcqio::{IoError, QpairOptions};
use mcqio_fixtures::{ExecMode, FakeConfig, Fault, FaultKind};
use rand::Rng;

fn run(exec: ExecMode, seed: u64) {
    let sync = exec == ExecMode::Sync;
    let (fake, ctrl) = open(FakeConfig {
        seed,
        ..config(exec, 5)
    });
    let f = fake.faults();
    f.set_probability(Fault::DuplicateCqe, 0.05);
    f.set_probability(Fault::CorruptCid, 0.01);
    f.set_probability(Fault::Delay(Duration::from_millis(2)), 0.05);
    f.set_probability(Fault::UNRECOVERED_READ_ERROR, 0.02);
    let depth = 32u16;
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth,
            ..Default::default()
        })
        .unwrap();
    let mut pool = buf(&ctrl, depth as usize * 4096).chunks(4096).unwrap();
    let mut r = rng(seed);
    let total = 3000u64;
    let mut next = 0u64;
    // tag -> (completions seen, ok / error kind)
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let mut errors = 0u64;
    let mut last_progress = Instant::now();
    let mut stale_total = 0u64;
    let mut aborted_total = 0u64;
    loop {
        while next < total {
            let Some(b) = pool.pop() else { break };
            let lba = r.gen_range(0..1000u64) * 8;
            let res = if r.gen_bool(0.5) {
                qp.read(1, lba, 8, b, next)
            } else {
                qp.write(1, lba, 8, b, next)
            };
            if let Err(e) = res {
                assert_eq!(e.kind, mcqio::SubmitErrorKind::QueueFull);
                pool.push(e.into_buf());
                break;
            }
            next += 1;
        }
        let n = qp
            .poll(usize::MAX, |c| {
                *seen.entry(c.tag).or_default() += 1;
                if c.result.is_err() {
                    errors += 1;
                }
                assert!(c.tag < next, "completion for a tag never submitted");
                pool.push(c.buf.expect("data commands return their buffer"));
            })
            .unwrap();
        if n > 0 {
            last_progress = Instant::now();
        }
        if next == total && qp.outstanding() == 0 {
            break;
        }
        // Commands whose completion was corrupted never come back; once
        // nothing has moved for a while, only those are left.
        if qp.outstanding() > 0 && last_progress.elapsed() > Duration::from_millis(300) {
            let mut stuck = 0;
            qp.check_timeouts(Duration::from_millis(250), |_| stuck += 1);
            if stuck == qp.outstanding() && (next == total || pool.is_empty() && qp.is_full()) {
                if next == total {
                    break;
                }
                // The queue is clogged with lost commands: a real
                // application would abort or reset; here, start over on a
                // fresh queue after closing this one.
                let mut closed = Vec::new();
                stale_total += qp.stats().stale_completions;
                let old = std::mem::replace(
                    &mut qp,
                    ctrl.create_qpair(QpairOptions {
                        depth,
                        ..Default::default()
                    })
                    .unwrap(),
                );
                old.close(|c| closed.push(c)).unwrap();
                for c in closed {
                    *seen.entry(c.tag).or_default() += 1;
                    aborted_total += (c.result == Err(IoError::Aborted)) as u64;
                    assert!(matches!(
                        c.result,
                        Err(IoError::Aborted) | Err(IoError::Nvme(_)) | Ok(())
                    ));
                    pool.push(c.buf.unwrap());
                }
                last_progress = Instant::now();
            }
        }
        if !sync {
            std::thread::yield_now();
        }
    }
    let stale = stale_total + qp.stats().stale_completions;
    let mut aborted = 0;
    let outstanding = qp.outstanding();
    qp.close(|c| {
        *seen.entry(c.tag).or_default() += 1;
        if c.result == Err(IoError::Aborted) {
            aborted += 1;
        }
    })
    .unwrap();
    assert!(aborted <= outstanding);
    aborted_total += aborted as u64;
    // Every lost (corrupt-CID) command came back through close as aborted.
    assert_eq!(
        aborted_total,
        f.count(FaultKind::CorruptCid),
        "lost commands are aborted by close"
    );
    assert_eq!(seen.len() as u64, total, "every tag completed");
    let dups: Vec<_> = seen.iter().filter(|(_, &n)| n != 1).collect();
    assert!(dups.is_empty(), "tags completed more than once: {dups:?}");
    assert!(errors > 0, "error statuses were delivered");
    let injected = f.count(FaultKind::DuplicateCqe) + f.count(FaultKind::CorruptCid);
    assert!(injected > 0);
    assert!(stale <= injected, "stale {stale} > injected {injected}");
}

#[test]
fn exactly_once_under_faults_sync() {
    run(ExecMode::Sync, 0x1234);
}

#[test]
fn exactly_once_under_faults_threaded() {
    run(
        ExecMode::Threaded {
            workers: 1,
            pin_core: None,
        },
        0x5678,
    );
}
