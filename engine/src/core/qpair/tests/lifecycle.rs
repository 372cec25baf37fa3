//! Named cases against the stub wire, one rule of `core::qpair` each.

use super::ledger::{Ledger, Shared};
use super::stub::{StubBuf, StubWire};
use crate::core::io::Completion;
use crate::core::qpair::Lifecycle;

/// A queue of `depth` with `n` reads accepted (tags 1..=n) and rung.
fn with_reads(depth: u16, per_poll: usize, n: u64) -> (Shared, StubWire) {
    let ledger = Shared::default();
    let mut q = StubWire::new(depth, per_poll, None, &ledger);
    for tag in 1..=n {
        let b = ledger.borrow_mut().buffer(tag);
        let st = std::sync::Arc::clone(&b.state);
        q.read(tag, b).map_err(|e| e.kind).expect("accepted");
        ledger.borrow_mut().accepted(tag, Some(st), 1);
    }
    assert!(Lifecycle::submit(&mut q));
    (ledger, q)
}

fn clean(ledger: &Shared) {
    let l = ledger.borrow();
    assert!(l.violations.is_empty(), "{:#?}", l.violations);
}

#[test]
fn a_reset_ends_every_command_once_with_its_buffer_and_rings_nothing_meanwhile() {
    let (ledger, mut q) = with_reads(8, 0, 4);
    q.device_complete(0, true);
    q.begin_reset(true);
    // Queued during the reset: the gate stays shut.
    let b = ledger.borrow_mut().buffer(5);
    let st = std::sync::Arc::clone(&b.state);
    q.read(5, b).map_err(|e| e.kind).unwrap();
    ledger.borrow_mut().accepted(5, Some(st), 1);
    let rung = q.doorbells;
    assert!(
        !Lifecycle::submit(&mut q),
        "no doorbell while the reset runs"
    );
    assert_eq!(q.doorbells, rung);
    let n = q
        .poll(usize::MAX, &mut |c: Completion<StubBuf>| {
            Ledger::deliver(&ledger, c)
        })
        .unwrap();
    assert_eq!(n, 5, "the posted one, then the rest aborted by the reset");
    q.check();
    clean(&ledger);
    assert_eq!(ledger.borrow().by_reset, 4);
    assert_eq!(q.all_counters().recoveries, 1);
    drop(q);
    clean(&ledger);
}

/// Found by the random scripts: recovery counted the commands it ended
/// (`failed_by_controller`, `aborted_by_reset`) only after ending all of
/// them, so a callback that panicked on the first left them uncounted
/// (the recovery the next poll resumes counted only the rest).
#[test]
fn a_panic_in_the_callback_during_recovery_loses_no_count() {
    use super::ledger::ScriptedPanic;
    for reset in [false, true] {
        let (ledger, mut q) = with_reads(4, 0, 3);
        if reset {
            q.begin_reset(true);
        } else {
            q.fail(false, false);
        }
        ledger.borrow_mut().panic_in = Some(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            q.poll(usize::MAX, &mut |c: Completion<StubBuf>| {
                Ledger::deliver(&ledger, c)
            })
        }));
        assert!(r.unwrap_err().is::<ScriptedPanic>());
        let _ = q.poll(usize::MAX, &mut |c: Completion<StubBuf>| {
            Ledger::deliver(&ledger, c)
        });
        let c = q.all_counters();
        assert_eq!(ledger.borrow().delivered, 3);
        assert_eq!(
            (c.aborted_by_reset, c.failed_by_controller),
            if reset { (3, 0) } else { (0, 3) },
            "every command counted once, the one whose callback panicked too"
        );
        q.check();
        clean(&ledger);
    }
}

/// Found by the random scripts: a close whose withdrawal failed (or was
/// not confirmed) ended every command as aborted, without its buffer,
/// even those whose completion the device had already posted: their
/// answer (and, for a completed read, its data) was lost.
#[test]
fn a_close_whose_withdrawal_fails_still_delivers_what_the_device_posted() {
    use super::stub::Withdraw;
    use crate::core::io::IoError;
    for w in [Withdraw::Unconfirmed, Withdraw::Refused] {
        let (ledger, mut q) = with_reads(4, 0, 3);
        q.device_complete(0, true);
        q.device_complete(0, false);
        q.withdraw = w;
        let mut ends = Vec::new();
        let _ = q.close(|c: Completion<StubBuf>| {
            ends.push((c.tag, c.result, c.buf.is_some()));
            Ledger::deliver(&ledger, c);
        });
        clean(&ledger);
        let posted: Vec<_> = ends.iter().filter(|e| e.2).collect();
        assert_eq!(posted.len(), 2, "{w:?}: the two posted come back: {ends:?}");
        assert!(
            ends.iter()
                .filter(|e| !e.2)
                .all(|e| e.1 == Err(IoError::Aborted)),
            "{w:?}: the one still on the device ends aborted, leaked: {ends:?}"
        );
    }
}

/// Found by the random scripts: a poll that handed out held completions
/// returned without ringing, so `poll(0)` (which rings what was queued)
/// rang nothing while a recovery's completions waited, and a command
/// queued behind them waited a poll more for its doorbell.
#[test]
fn a_poll_handing_out_held_completions_still_rings() {
    let (ledger, mut q) = with_reads(4, 0, 2);
    let mut f = |c: Completion<StubBuf>| Ledger::deliver(&ledger, c);
    q.begin_reset(true);
    assert_eq!(q.poll(0, &mut f).unwrap(), 0, "poll(0) delivers nothing");
    assert_eq!(q.eng.held.len(), 2, "the reset's completions are held");
    let b = ledger.borrow_mut().buffer(3);
    let st = std::sync::Arc::clone(&b.state);
    q.read(3, b).map_err(|e| e.kind).unwrap();
    ledger.borrow_mut().accepted(3, Some(st), 1);
    let rung = q.doorbells;
    assert_eq!(q.poll(0, &mut f).unwrap(), 0);
    assert_eq!(q.doorbells, rung + 1, "poll(0) rang for the new command");
    assert_eq!(q.queued(), 0);
    assert_eq!(q.poll(1, &mut f).unwrap(), 1, "held ones first");
    q.check();
    clean(&ledger);
}

/// Issue 39 item 5c: `wait(max = 0, None)` with a command outstanding can
/// deliver nothing and has no limit, so it polled forever. Refused, with
/// or without a limit, before anything is polled.
#[test]
fn a_wait_for_no_completion_is_refused() {
    use crate::core::error::Error;
    use std::time::Duration;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (ledger, mut q) = with_reads(4, 0, 1);
        let mut f = |c: Completion<StubBuf>| Ledger::deliver(&ledger, c);
        let unlimited = q.wait(0, None, &mut f);
        let limited = q.wait(0, Some(Duration::from_millis(1)), &mut f);
        let _ = tx.send((unlimited, limited));
    });
    let (unlimited, limited) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("wait(0, None) returned within 60 s (it polled forever)");
    assert!(
        matches!(unlimited, Err(Error::InvalidOption(_))),
        "{unlimited:?}"
    );
    assert!(
        matches!(limited, Err(Error::InvalidOption(_))),
        "{limited:?}"
    );
}

/// Issue 39 item 8 (the release-only failure of
/// `hybrid_spins_after_a_completion_then_sleeps`): a hybrid wait looked at
/// its spin window only every `SPIN_BATCH` (32) empty polls, so a window
/// already over when the wait began (a zero spin; no completion yet) was
/// still spun 31 polls long, and a completion that came within them was
/// taken without a sleep. On the NVMe fake in release 32 polls outlast a
/// read, so `Hybrid { spin: 0 }` almost never slept there. Here the
/// device posts just before the fifth reap: a wait whose window is over
/// arms after the first empty poll and sleeps as `Interrupt` does.
#[test]
fn a_hybrid_wait_whose_window_is_over_sleeps_as_interrupt_does() {
    use crate::core::qpair::wait::Waiter;
    use crate::core::qpair::{Interrupt, WaitPolicy};
    use mcqio_vfio::Notifier;
    use std::sync::Arc;
    use std::time::Duration;
    let sleeps = |policy: WaitPolicy| {
        let (ledger, mut q) = with_reads(4, 0, 1);
        let irq = Interrupt::Notifier(Arc::new(Notifier::new().unwrap()));
        q.eng.wait = Waiter::new(policy, Some(irq), false);
        // The device posts by reaps, not by time: each sleep runs out its
        // (short) slice, and the count of sleeps depends on polls alone.
        q.eng.wait.slice = Duration::from_millis(1);
        q.complete_at_reap = Some(4);
        let n = q
            .wait(1, Some(Duration::from_secs(60)), &mut |c: Completion<
                StubBuf,
            >| {
                Ledger::deliver(&ledger, c)
            })
            .unwrap();
        assert_eq!(n, 1, "{policy:?}");
        clean(&ledger);
        q.all_counters().interrupt_sleeps
    };
    let interrupt = sleeps(WaitPolicy::Interrupt);
    assert!(interrupt > 0, "an interrupt wait sleeps");
    let zero = sleeps(WaitPolicy::Hybrid {
        spin: Duration::ZERO,
    });
    assert_eq!(zero, interrupt, "a zero spin sleeps as Interrupt does");
    // No completion yet: the window is over too.
    let long = sleeps(WaitPolicy::Hybrid {
        spin: Duration::from_secs(600),
    });
    assert_eq!(
        long, interrupt,
        "with no completion yet, nothing to spin after"
    );
}

/// A read no healthy device gives makes the very poll look at the
/// controller's health (not after `HEALTH_CHECK_INTERVAL` empty polls):
/// the failure it finds (disabled: a new epoch) ends every command with its
/// buffer, and the poll reports the stopped queue.
#[test]
fn a_suspect_read_looks_at_health_at_once() {
    use crate::core::error::Error;
    let (ledger, mut q) = with_reads(4, 0, 2);
    let mut f = |c: Completion<StubBuf>| Ledger::deliver(&ledger, c);
    q.health_failure = Some((true, false));
    assert_eq!(q.poll(usize::MAX, &mut f).unwrap(), 0, "an empty poll");
    assert_eq!(q.health_looks, 0, "the first empty poll does not look");
    q.suspect = true;
    let r = q.poll(usize::MAX, &mut f);
    assert!(matches!(r, Err(Error::ControllerFatal)), "{r:?}");
    assert_eq!(q.health_looks, 1);
    assert_eq!(ledger.borrow().by_failure, 2);
    q.check();
    clean(&ledger);
}

/// What a timeout scan ends beyond the poll's budget is held and handed
/// out first by the next polls. (The scan runs when the queue's coarse
/// clock says it is due: real time, waited for with a generous limit.)
#[test]
fn a_timeout_scan_beyond_the_budget_is_held() {
    use crate::core::io::IoError;
    use std::time::{Duration, Instant};
    let ledger = Shared::default();
    let mut q = StubWire::new(4, 0, Some(Duration::from_millis(1)), &ledger);
    for tag in 1..=4 {
        let b = ledger.borrow_mut().buffer(tag);
        let st = std::sync::Arc::clone(&b.state);
        q.read(tag, b).map_err(|e| e.kind).unwrap();
        ledger.borrow_mut().accepted(tag, Some(st), 1);
    }
    let mut ends = Vec::new();
    let mut f = |c: Completion<StubBuf>| {
        ends.push(c.result);
        Ledger::deliver(&ledger, c)
    };
    q.expire = 3;
    let start = Instant::now();
    loop {
        let n = q.poll(1, &mut f).unwrap();
        if q.timeout_scans > 0 {
            assert_eq!(n, 1, "the scan's poll delivers its budget");
            break;
        }
        assert_eq!(n, 0, "nothing before the scan");
        assert!(start.elapsed() < Duration::from_secs(60), "no scan in 60 s");
    }
    assert_eq!(
        q.eng.held.len(),
        2,
        "one delivered by the scan's poll, two held"
    );
    assert_eq!(q.poll(usize::MAX, &mut f).unwrap(), 2, "the held ones");
    assert_eq!(ends, [Err(IoError::TimedOut); 3]);
    q.check();
    clean(&ledger);
    assert_eq!(q.eng.outstanding(0), 1, "the fourth is still on the device");
}
