//! The controller state word: one encoding and one rule for every wire.
//!
//! Each controller keeps one [`StateWord`], which every queue pair reads
//! with one relaxed load per poll and per submit batch and compares with
//! the value it last acted on. Bits:
//!
//! | bits | meaning |
//! |------|---------|
//! | 1:0  | failure: [`OK`], [`FATAL`] (the controller reported a fatal error, or a reset's bring-up failed), [`GONE`] (registers read all ones) |
//! | 2    | [`RESETTING`]: a reset is running; ring no doorbell |
//! | 63:3 | the epoch, one [`EPOCH`] step per disable |
//!
//! **The rule (fail → disable → leak).** A controller that fails is
//! disabled first (NVMe: CC.EN = 0 until CSTS.RDY = 0; UFS: HCE = 0 read
//! back). Only once that is confirmed — or the device is gone and can no
//! longer DMA — does the epoch advance ([`next`]): the controller dropped
//! every queue and command and accesses none of their memory, so queue
//! pairs hand buffers back. A failure whose disable was not confirmed keeps
//! the epoch ([`kept`]): the device may still read and write the queues'
//! rings, descriptors and buffers, so queue pairs end their commands
//! **without** their buffers and leak the memory ([`Change::Undisabled`]).
//! A reset is a disable followed by a bring-up: a new epoch, marked
//! [`FATAL`] until the bring-up succeeded.

use std::sync::atomic::{AtomicU64, Ordering};

/// No failure.
pub const OK: u64 = 0;
/// A fatal controller error (NVMe CSTS.CFS, UFS IS fatal bits), or a
/// bring-up that failed.
pub const FATAL: u64 = 1;
/// Registers read all ones: the device is gone.
pub const GONE: u64 = 2;
/// The failure bits.
pub const FAILURE: u64 = 3;
/// A reset is running.
pub const RESETTING: u64 = 4;
/// One epoch step.
pub const EPOCH: u64 = 8;

/// The failure bits of `s` ([`OK`], [`FATAL`], [`GONE`]).
#[inline(always)]
pub const fn failure(s: u64) -> u64 {
    s & FAILURE
}

/// The epoch bits of `s`.
#[inline(always)]
pub const fn epoch(s: u64) -> u64 {
    s & !(EPOCH - 1)
}

/// The word after a disable was confirmed (or the device is gone): the
/// next epoch, with `failure`.
pub const fn next(s: u64, failure: u64) -> u64 {
    (epoch(s) + EPOCH) | (failure & FAILURE)
}

/// The word after a failure whose disable was not confirmed: the same
/// epoch (the device may still access memory), with `failure`.
pub const fn kept(s: u64, failure: u64) -> u64 {
    epoch(s) | (failure & FAILURE)
}

/// What a change from the value a queue pair acted on (`seen`) to the
/// settled value `now` means for that queue pair.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// No change.
    Same,
    /// The same epoch with a failure: the controller could not be disabled,
    /// and may still access the queue's memory. End every command without
    /// its buffer and leak the memory.
    Undisabled,
    /// A new epoch: the controller was disabled (or is gone) since and
    /// dropped every queue. End every command with its buffer; if the word
    /// carries no failure, re-create the queue.
    NewEpoch {
        /// The controller is failed (or gone): do not re-create.
        failed: bool,
    },
}

/// Classify the change from `seen` to `now`.
pub const fn change(seen: u64, now: u64) -> Change {
    if seen == now {
        Change::Same
    } else if epoch(seen) == epoch(now) {
        Change::Undisabled
    } else {
        Change::NewEpoch {
            failed: failure(now) != OK,
        }
    }
}

/// Why a queue pair stopped accepting commands.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The controller failed.
    Fatal,
    /// The device is gone.
    Gone,
    /// The queue could not be re-created after a reset.
    Lost,
}

impl Stopped {
    /// The failure of state word `s`, if any.
    pub const fn of(s: u64) -> Option<Stopped> {
        match failure(s) {
            OK => None,
            GONE => Some(Stopped::Gone),
            _ => Some(Stopped::Fatal),
        }
    }
}

/// A controller with a state word, as its queue pairs see it.
pub(crate) trait Controlled {
    /// The controller's state word.
    fn state_word(&self) -> &StateWord;
    /// The state word once no reset is running (waits for one to finish).
    fn settled_state(&self) -> u64;
}

/// A controller's state word (see the module docs).
#[derive(Debug)]
pub struct StateWord(AtomicU64);

impl Default for StateWord {
    fn default() -> Self {
        StateWord(AtomicU64::new(OK))
    }
}

impl StateWord {
    /// One relaxed load: what every poll and submit batch compares.
    #[inline(always)]
    pub fn load(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// An acquire load: also see what the writer did before its store
    /// (taken by the side that acts on a change).
    pub fn load_acquire(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Publish `s`. Release: a queue pair that sees the new word with an
    /// acquire load also sees the register writes (the disable) before it.
    pub fn store(&self, s: u64) {
        self.0.store(s, Ordering::Release)
    }

    /// Mark a reset as running (from `s`): queue pairs ring no doorbell.
    pub fn begin_reset(&self, s: u64) {
        self.store(s | RESETTING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_keeps_failure_reset_and_epoch_apart() {
        let s = OK;
        assert_eq!(failure(s | RESETTING), OK);
        let d = next(s | RESETTING, FATAL);
        assert_eq!((failure(d), d & RESETTING, epoch(d)), (FATAL, 0, EPOCH));
        assert_eq!(kept(d, GONE), EPOCH | GONE);
        assert_eq!(change(s, s), Change::Same);
        assert_eq!(change(s, kept(s, FATAL)), Change::Undisabled);
        assert_eq!(change(s, next(s, OK)), Change::NewEpoch { failed: false });
        assert_eq!(change(s, next(s, GONE)), Change::NewEpoch { failed: true });
        assert_eq!(Stopped::of(next(s, GONE)), Some(Stopped::Gone));
        assert_eq!(Stopped::of(next(s, FATAL)), Some(Stopped::Fatal));
        assert_eq!(Stopped::of(next(s, OK)), None);
    }
}
