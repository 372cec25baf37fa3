//! Property tests over random scripts: submissions, doorbells, polls and
//! waits with small budgets, device completions, stale and duplicate
//! entries, suspect reads, failures found by the health look or at once,
//! resets (their re-creation succeeding, moving on or failing), a callback
//! that panics, then a close (withdrawal confirmed, not confirmed, refused
//! or cut by a reset; its callback may panic too) or a drop. After every
//! step the counters agree with the ledger; at the end every command ended
//! exactly once, no buffer came back or was freed while the device held
//! it, and none was leaked that the device had let go.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use proptest::prelude::*;

use super::ledger::{Ledger, ScriptedPanic, Shared};
use super::stub::{Recreate, StubBuf, StubWire, Withdraw};
use crate::core::io::Completion;
use crate::core::qpair::Lifecycle;

#[derive(Copy, Clone, Debug)]
enum Op {
    Read,
    Flush,
    Split(u32),
    Internal,
    Ring,
    Poll(usize),
    Wait(usize),
    Complete { pick: u8, ok: bool },
    Stale(u16),
    Suspect,
    HealthFails { disabled: bool, gone: bool },
    Fail { disabled: bool, gone: bool },
    Reset { bring_up_ok: bool },
    NextRecreate(Recreate),
    PanicIn(u32),
}

#[derive(Copy, Clone, Debug)]
enum End {
    Close {
        withdraw: Withdraw,
        panic_in: Option<u32>,
    },
    Drop,
}

fn max() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), Just(1), Just(2), Just(usize::MAX)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Read),
        1 => Just(Op::Flush),
        1 => (2u32..=4).prop_map(Op::Split),
        1 => Just(Op::Internal),
        3 => Just(Op::Ring),
        5 => max().prop_map(Op::Poll),
        1 => max().prop_map(|m| Op::Wait(m.max(1))),
        6 => (any::<u8>(), prop::bool::weighted(0.85)).prop_map(|(pick, ok)| Op::Complete { pick, ok }),
        1 => any::<u16>().prop_map(Op::Stale),
        1 => Just(Op::Suspect),
        1 => (any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(disabled, gone)| Op::HealthFails { disabled, gone }),
        1 => (any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(disabled, gone)| Op::Fail { disabled, gone }),
        1 => prop::bool::weighted(0.8).prop_map(|bring_up_ok| Op::Reset { bring_up_ok }),
        1 => prop_oneof![
            Just(Recreate::Moved),
            any::<bool>().prop_map(|left| Recreate::Failed { left }),
        ]
        .prop_map(Op::NextRecreate),
        1 => (1u32..=3).prop_map(Op::PanicIn),
    ]
}

fn end() -> impl Strategy<Value = End> {
    let withdraw = prop_oneof![
        3 => (0u8..=3).prop_map(Withdraw::Confirmed),
        1 => Just(Withdraw::Unconfirmed),
        1 => Just(Withdraw::Refused),
        1 => Just(Withdraw::Reset),
    ];
    prop_oneof![
        3 => (withdraw, prop::option::weighted(0.3, 1u32..=2))
            .prop_map(|(withdraw, panic_in)| End::Close { withdraw, panic_in }),
        1 => Just(End::Drop),
    ]
}

/// Run `step`; a scripted panic is part of the script, any other is not.
fn guarded<R>(step: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(step)) {
        Ok(r) => Some(r),
        Err(p) if p.is::<ScriptedPanic>() => None,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// The violations so far, as a test failure.
fn verdict(ledger: &Shared, at: &str) -> std::result::Result<(), TestCaseError> {
    let l = ledger.borrow();
    prop_assert!(l.violations.is_empty(), "{at}: {:#?}", l.violations);
    Ok(())
}

fn run(
    depth: u16,
    per_poll: usize,
    ops: &[Op],
    end: End,
) -> std::result::Result<(), TestCaseError> {
    let ledger = Shared::default();
    let mut q = StubWire::new(depth, per_poll, None, &ledger);
    let mut tag = 0u64;
    let deliver = |c: Completion<StubBuf>| Ledger::deliver(&ledger, c);
    for (i, &op) in ops.iter().enumerate() {
        let before = ledger.borrow().delivered;
        // A poll or wait that returned (did not panic).
        let mut returned = false;
        match op {
            Op::Read => {
                tag += 1;
                let b = ledger.borrow_mut().buffer(tag);
                let st = std::sync::Arc::clone(&b.state);
                match q.read(tag, b) {
                    Ok(()) => ledger.borrow_mut().accepted(tag, Some(st), 1),
                    Err(e) => prop_assert_eq!(e.buf.id, tag, "the refused buffer comes back"),
                }
            }
            Op::Flush => {
                tag += 1;
                if q.flush(tag).is_ok() {
                    ledger.borrow_mut().accepted(tag, None, 1);
                }
            }
            Op::Split(n) => {
                tag += 1;
                let b = ledger.borrow_mut().buffer(tag);
                let st = std::sync::Arc::clone(&b.state);
                match q.read_split(tag, b, n) {
                    Ok(()) => ledger.borrow_mut().accepted(tag, Some(st), n as usize),
                    Err(e) => prop_assert_eq!(e.buf.id, tag, "the refused buffer comes back"),
                }
            }
            Op::Internal => {
                q.internal();
            }
            Op::Ring => {
                q.submit();
            }
            Op::Poll(max) => {
                let r = guarded(|| q.poll(max, &mut { deliver }));
                returned = r.is_some();
                let got = ledger.borrow().delivered - before;
                prop_assert!(got as usize <= max, "poll({max}) delivered {got}");
                if let Some(Ok(n)) = r {
                    prop_assert_eq!(n as u64, got, "poll's count");
                }
            }
            Op::Wait(max) => {
                let r = guarded(|| q.wait(max, Some(Duration::ZERO), &mut { deliver }));
                returned = r.is_some();
                let got = ledger.borrow().delivered - before;
                prop_assert!(got as usize <= max, "wait({max}) delivered {got}");
                if let Some(Ok(n)) = r {
                    prop_assert_eq!(n as u64, got, "wait's count");
                }
            }
            Op::Complete { pick, ok } => {
                q.device_complete(usize::from(pick), ok);
            }
            Op::Stale(seed) => q.device_stale(seed),
            Op::Suspect => q.suspect = true,
            Op::HealthFails { disabled, gone } => q.health_failure = Some((disabled, gone)),
            Op::Fail { disabled, gone } => q.fail(disabled, gone),
            Op::Reset { bring_up_ok } => q.begin_reset(bring_up_ok),
            Op::NextRecreate(r) => q.recreate.push_back(r),
            Op::PanicIn(n) => ledger.borrow_mut().panic_in = Some(n),
        }
        if returned && Lifecycle::gate(&q) {
            prop_assert_eq!(
                q.queued(),
                0,
                "a poll with the gate open rings what was queued"
            );
        }
        q.check();
        verdict(&ledger, &format!("after step {i} ({op:?})"))?;
    }
    match end {
        End::Close { withdraw, panic_in } => {
            q.withdraw = withdraw;
            ledger.borrow_mut().panic_in = panic_in;
            // A panic in close's callback drops the queue pair while it
            // unwinds: its `Drop` carries closing on.
            let _ = guarded(move || q.close(deliver));
        }
        End::Drop => drop(q),
    }
    verdict(&ledger, &format!("after {end:?}"))?;
    let l = ledger.borrow();
    let left: Vec<_> = l.sent.keys().collect();
    prop_assert!(left.is_empty(), "never ended: {left:?}");
    for (i, b) in l.bufs.iter().enumerate() {
        prop_assert!(
            !b.freed_while_held(),
            "buffer {} was freed while the device held it",
            i + 1
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 192 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_command_ends_once_and_no_buffer_returns_while_held(
        depth in 1u16..=8,
        per_poll in 0usize..=3,
        ops in prop::collection::vec(op(), 0..48),
        end in end(),
    ) {
        run(depth, per_poll, &ops, end)?;
    }
}
