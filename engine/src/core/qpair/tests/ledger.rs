//! The harness's own record of every command, kept apart from the core:
//! what was accepted, what the stub's device posted for it, and what came
//! back. Every rule the suite checks is written here, once, in terms of
//! this record and the device's hold on each buffer ([`BufState`]), never
//! in terms of the core's state.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

use super::stub::{BufState, StubBuf};
use crate::core::io::{Completion, IoError};

/// The tag the stub gives its own commands; none may reach the callback.
pub(super) const INTERNAL_TAG: u64 = u64::MAX;

/// The payload of a panic the script asked for. Any other panic is a
/// failure of the suite and is passed on.
pub(super) struct ScriptedPanic;

/// One accepted command, not yet delivered.
pub(super) struct Sent {
    /// Its buffer's hold record (`None`: a command without data).
    pub buf: Option<Arc<BufState>>,
    /// The commands it went out as (a split's children; 1 otherwise).
    pub parts: usize,
    /// Entries the device posted for its parts: successes, errors.
    pub posted_ok: usize,
    pub posted_err: usize,
}

/// The record (see the module docs).
#[derive(Default)]
pub(super) struct Ledger {
    /// Accepted and not yet delivered, by tag.
    pub sent: BTreeMap<u64, Sent>,
    /// Delivered tags.
    pub done: BTreeSet<u64>,
    /// Completions the callback received.
    pub delivered: u64,
    /// Commands accepted, each child of a split counted.
    pub parts: u64,
    /// Delivered with `AbortedByReset`, with `ControllerFailed`.
    pub by_reset: u64,
    pub by_failure: u64,
    /// Broken rules, in words.
    pub violations: Vec<String>,
    /// The callback panics at this delivery from now (1: the next one).
    pub panic_in: Option<u32>,
    /// Every buffer handed to the queue, to look at after the end.
    pub bufs: Vec<Arc<BufState>>,
}

/// The ledger as the callback and the stub's `Drop` share it.
pub(super) type Shared = Rc<RefCell<Ledger>>;

impl Ledger {
    /// A new buffer for the command `tag`, recorded.
    pub fn buffer(&mut self, tag: u64) -> StubBuf {
        let b = StubBuf::new(tag);
        self.bufs.push(Arc::clone(&b.state));
        b
    }

    /// The queue accepted `tag`, going out as `parts` commands.
    pub fn accepted(&mut self, tag: u64, buf: Option<Arc<BufState>>, parts: usize) {
        self.parts += parts as u64;
        let old = self.sent.insert(
            tag,
            Sent {
                buf,
                parts,
                posted_ok: 0,
                posted_err: 0,
            },
        );
        assert!(old.is_none(), "the script reused tag {tag}");
    }

    /// The device posted an entry for a part of `tag`.
    pub fn posted(&mut self, tag: u64, ok: bool) {
        if tag == INTERNAL_TAG {
            return;
        }
        match self.sent.get_mut(&tag) {
            Some(s) if ok => s.posted_ok += 1,
            Some(s) => s.posted_err += 1,
            None => self.violations.push(format!(
                "the device completed tag {tag}, which is not in flight"
            )),
        }
    }

    /// The callback: check `c` against the record, then panic if the
    /// script says so (after the record is updated and the borrow let go,
    /// as a real callback that panics has taken its completion).
    pub fn deliver(ledger: &Shared, c: Completion<StubBuf>) {
        let boom = {
            let mut l = ledger.borrow_mut();
            l.record(c);
            match l.panic_in {
                Some(1) => {
                    l.panic_in = None;
                    true
                }
                Some(n) => {
                    l.panic_in = Some(n - 1);
                    false
                }
                None => false,
            }
        };
        if boom {
            std::panic::panic_any(ScriptedPanic);
        }
    }

    /// The checks every completion passes.
    fn record(&mut self, c: Completion<StubBuf>) {
        let tag = c.tag;
        let Some(s) = self.sent.remove(&tag) else {
            let why = if tag == INTERNAL_TAG {
                "the wire's own command reached the callback".to_string()
            } else if self.done.contains(&tag) {
                format!("tag {tag} was delivered twice")
            } else {
                format!("tag {tag} was never accepted")
            };
            self.violations.push(why);
            return;
        };
        self.done.insert(tag);
        self.delivered += 1;
        match (&c.buf, &s.buf) {
            (Some(b), Some(st)) => {
                if b.id != tag {
                    self.violations
                        .push(format!("tag {tag} came back with buffer {}", b.id));
                }
                if st.held() {
                    self.violations.push(format!(
                        "tag {tag}'s buffer came back while the device holds it"
                    ));
                }
            }
            // Leaked: the device held it when it ended (a held completion
            // is delivered later, after the device may have let go).
            (None, Some(st)) => {
                if !st.ever_held() {
                    self.violations.push(format!(
                        "tag {tag}'s buffer was leaked though the device never had it"
                    ));
                }
            }
            (Some(b), None) => self.violations.push(format!(
                "tag {tag} had no buffer but came back with {}",
                b.id
            )),
            (None, None) => {}
        }
        let posted = s.posted_ok + s.posted_err;
        let fits = match &c.result {
            Ok(()) => s.posted_ok == s.parts,
            // The device's error (a split: the first one a child reported).
            Err(IoError::Nvme(_)) => s.posted_err > 0,
            Err(e) => {
                match e {
                    IoError::AbortedByReset => self.by_reset += 1,
                    IoError::ControllerFailed => self.by_failure += 1,
                    _ => {}
                }
                s.posted_err == 0 && posted < s.parts
            }
        };
        if !fits {
            self.violations.push(format!(
                "tag {tag} ended {:?} after the device posted {} ok and {} failed of {} parts",
                c.result, s.posted_ok, s.posted_err, s.parts
            ));
        }
        // `c` (and its buffer) is dropped here: the device let it go.
    }
}
