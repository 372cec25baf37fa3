//! The stub wire: an in-memory device with a submission list and a
//! completion ring, and a queue pair over it that implements only the
//! required hooks of [`Wire`]. Nothing here is a copy of a real wire: the
//! device is a few lists the script drives (complete a command, post a
//! stale entry, fail, reset), and each hook does the least its contract in
//! `core::qpair` asks, so what the suite sees is the core's lifecycle.
//!
//! The device holds a command's buffer from submission until it posts the
//! command's entry, or the device is disabled (a reset, a failure whose
//! disable was confirmed, a confirmed withdrawal); a failure without a
//! disable, or a withdrawal it did not confirm, leaves it holding them for
//! good ([`BufState`]).

use crate::core::qpair::Lifecycle;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mcqio_vfio::{DmaDir, DmaSpace, Iova};

use super::ledger::{Ledger, Shared, INTERNAL_TAG};
use crate::core::error::{Error, Result};
use crate::core::io::{Completion, IoBuf, IoError, IoSeg, SubmitError, SubmitErrorKind};
use crate::core::qpair::{Engine, Reaped, Recreated, SplitRequest, Wire};
use crate::core::state::{self, Controlled, StateWord, Stopped};
use crate::core::timeout::TimeoutPolicy;
// Plain data of a transport's leaf `spec` module (`.ci/core-is-neutral`):
// the stub's device reports its errors as a status code.
use crate::nvme::spec::status::NvmeStatus;

/// The device's hold on a buffer: how many of its commands (a split's
/// children each count) the device may still access it for, and whether
/// it was freed meanwhile.
#[derive(Debug, Default)]
pub(in crate::core::qpair) struct BufState {
    holders: AtomicU32,
    ever_held: AtomicBool,
    freed_while_held: AtomicBool,
}

impl BufState {
    /// The device may still access the buffer.
    pub fn held(&self) -> bool {
        self.holders.load(Ordering::Relaxed) > 0
    }

    /// The device was given the buffer at some point.
    pub fn ever_held(&self) -> bool {
        self.ever_held.load(Ordering::Relaxed)
    }

    /// The buffer was dropped while the device could access it.
    pub fn freed_while_held(&self) -> bool {
        self.freed_while_held.load(Ordering::Relaxed)
    }

    fn hold(&self) {
        self.ever_held.store(true, Ordering::Relaxed);
        self.holders.fetch_add(1, Ordering::Relaxed);
    }

    fn release(&self) {
        let was = self.holders.fetch_sub(1, Ordering::Relaxed);
        assert!(was > 0, "released a buffer the device did not hold");
    }
}

/// A buffer that is only a number (its command's tag) and a hold record.
pub(in crate::core::qpair) struct StubBuf {
    pub id: u64,
    pub state: Arc<BufState>,
}

impl StubBuf {
    pub fn new(id: u64) -> Self {
        StubBuf {
            id,
            state: Arc::default(),
        }
    }
}

impl Drop for StubBuf {
    fn drop(&mut self) {
        if self.state.held() {
            self.state.freed_while_held.store(true, Ordering::Relaxed);
        }
    }
}

// SAFETY: a `StubBuf` names no memory. `is_mapped_in` is false for every
// space, so no segment is promised to be mapped anywhere and nothing is
// ever given to a device to DMA through (the stub wire only moves the
// value); every answer is a constant of the value.
unsafe impl IoBuf for StubBuf {
    fn segment_count(&self) -> usize {
        1
    }

    fn segment(&self, _i: usize) -> IoSeg {
        IoSeg {
            iova: Iova(self.id << 12),
            len: 4096,
        }
    }

    fn dir(&self) -> DmaDir {
        DmaDir::Bidirectional
    }

    fn is_mapped_in(&self, _space: &DmaSpace) -> bool {
        false
    }
}

/// A command as the device has it.
struct Cmd {
    cid: u16,
    tag: u64,
    /// The buffer's hold record, and whether the device holds it (a
    /// command queued while the device was disabled is never seen).
    buf: Option<Arc<BufState>>,
    held: bool,
}

impl Cmd {
    fn release(self) {
        if let (true, Some(b)) = (self.held, &self.buf) {
            b.release();
        }
    }
}

/// A completion entry in the ring.
#[derive(Copy, Clone, Debug)]
struct Entry {
    cid: u16,
    ok: bool,
    /// Posted as stale or duplicate (the harness's knowledge, not the core's).
    stale: bool,
}

/// The device (see the module docs).
#[derive(Default)]
struct Device {
    /// Submitted, no doorbell yet.
    queued: Vec<Cmd>,
    /// Rung: the device may complete them.
    fetched: Vec<Cmd>,
    /// Given up on by the host while the device may still access them.
    abandoned: Vec<Cmd>,
    /// Entries posted and not yet consumed.
    cq: VecDeque<Entry>,
    /// CIDs of entries posted before (for duplicates).
    done: Vec<u16>,
    /// The device has the queue (created, not disabled since).
    live: bool,
}

impl Device {
    fn give(&mut self, cid: u16, tag: u64, buf: Option<Arc<BufState>>) {
        let held = self.live && buf.is_some();
        if held {
            buf.as_ref().unwrap().hold();
        }
        self.queued.push(Cmd {
            cid,
            tag,
            buf,
            held,
        });
    }

    /// Disabled: every command dropped, every buffer let go; the ring's
    /// memory keeps what was posted.
    fn disable(&mut self) {
        for c in self
            .queued
            .drain(..)
            .chain(self.fetched.drain(..))
            .chain(self.abandoned.drain(..))
        {
            c.release();
        }
        self.live = false;
    }

    /// Post the entry of the `pick`-th fetched command; its tag.
    fn complete(&mut self, pick: usize, ok: bool) -> Option<u64> {
        if !self.live || self.fetched.is_empty() {
            return None;
        }
        let c = self.fetched.swap_remove(pick % self.fetched.len());
        self.cq.push_back(Entry {
            cid: c.cid,
            ok,
            stale: false,
        });
        self.done.push(c.cid);
        let tag = c.tag;
        c.release();
        Some(tag)
    }

    /// Post an entry that matches nothing in flight: a duplicate of an
    /// earlier one (`seed` even), or a CID the device does not have.
    fn stale(&mut self, seed: u16) {
        let cid = match self.done.len() {
            n if n > 0 && seed % 2 == 0 => self.done[usize::from(seed / 2) % n],
            _ => seed,
        };
        let live = |l: &[Cmd]| l.iter().any(|c| c.cid == cid);
        if live(&self.queued) || live(&self.fetched) || live(&self.abandoned) {
            return;
        }
        self.cq.push_back(Entry {
            cid,
            ok: true,
            stale: true,
        });
    }
}

/// The controller: a state word and the device.
pub(in crate::core::qpair) struct StubCtrl {
    word: StateWord,
    /// The failure bits a running reset's bring-up ends with.
    bring_up: Cell<u64>,
    dev: RefCell<Device>,
}

impl Controlled for StubCtrl {
    fn state_word(&self) -> &StateWord {
        &self.word
    }

    /// A running reset finishes here: its disable dropped every queue.
    fn settled_state(&self) -> u64 {
        let s = self.word.load();
        if s & state::RESETTING == 0 {
            return s;
        }
        self.dev.borrow_mut().disable();
        let n = state::next(s, self.bring_up.get());
        self.word.store(n);
        n
    }
}

impl StubCtrl {
    /// The controller fails now (`gone`: it disappears); `disabled`: the
    /// disable was confirmed (a new epoch), else it may still access
    /// everything.
    fn fail(&self, disabled: bool, gone: bool) {
        let s = self.settled_state();
        let failure = if gone { state::GONE } else { state::FATAL };
        if disabled {
            self.dev.borrow_mut().disable();
            self.word.store(state::next(s, failure));
        } else {
            self.word.store(state::kept(s, failure));
        }
    }
}

/// What the next re-creation of the queue does.
#[derive(Copy, Clone, Debug)]
pub(in crate::core::qpair) enum Recreate {
    Yes,
    /// Another reset runs meanwhile.
    Moved,
    /// It fails; `left`: the queue may be on the device.
    Failed {
        left: bool,
    },
}

/// What closing's withdrawal does.
#[derive(Copy, Clone, Debug)]
pub(in crate::core::qpair) enum Withdraw {
    /// The device first completes up to this many commands (as a deletion
    /// aborts them), then lets go of everything.
    Confirmed(u8),
    /// It answers but does not confirm: it may still hold them.
    Unconfirmed,
    /// It fails: the queue stays on the device.
    Refused,
    /// A reset removes the queue meanwhile.
    Reset,
}

/// The queue pair over the stub device.
pub(in crate::core::qpair) struct StubWire {
    pub eng: Engine<StubBuf, ()>,
    ctrl: StubCtrl,
    /// Slots holding the wire's own commands.
    internal: Vec<bool>,
    pub internal_busy: usize,
    /// The next reap reads a value no healthy device gives.
    pub suspect: bool,
    /// The next health look finds the controller failed: (disabled, gone).
    pub health_failure: Option<(bool, bool)>,
    /// The next re-creations, in order (then `Yes`).
    pub recreate: VecDeque<Recreate>,
    /// What closing's withdrawal does.
    pub withdraw: Withdraw,
    /// The device posts the entry of its first fetched command just
    /// before the reap after this many (0: the next one).
    pub complete_at_reap: Option<u32>,
    /// At the next timeout scans, the device gives up this many fetched
    /// commands (a cleanup it confirms); they end as timed out.
    pub expire: usize,
    pub doorbells: u64,
    pub health_looks: u64,
    pub timeout_scans: u64,
    /// Stale entries the reaps consumed.
    pub stale_consumed: u64,
    pub leaked: Cell<u64>,
    pub closed: Option<bool>,
    ledger: Shared,
}

/// The stub's device error.
fn device_error() -> IoError {
    IoError::Nvme(NvmeStatus::new(0, 0x06))
}

impl StubWire {
    /// A queue of `depth` on a live device; at most `max_per_poll` per
    /// poll (0: the depth); commands time out after `io_timeout`.
    pub fn new(
        depth: u16,
        max_per_poll: usize,
        io_timeout: Option<Duration>,
        ledger: &Shared,
    ) -> Self {
        let ctrl = StubCtrl {
            word: StateWord::default(),
            bring_up: Cell::new(state::OK),
            dev: RefCell::new(Device {
                live: true,
                ..Device::default()
            }),
        };
        let eng = Engine::new(
            depth,
            max_per_poll,
            1 << 20,
            io_timeout,
            TimeoutPolicy::Abort,
            Duration::from_secs(1),
            ctrl.word.load(),
        );
        StubWire {
            internal: vec![false; eng.trackers.slots()],
            eng,
            ctrl,
            internal_busy: 0,
            suspect: false,
            health_failure: None,
            recreate: VecDeque::new(),
            withdraw: Withdraw::Confirmed(0),
            complete_at_reap: None,
            expire: 0,
            doorbells: 0,
            health_looks: 0,
            timeout_scans: 0,
            stale_consumed: 0,
            leaked: Cell::new(0),
            closed: None,
            ledger: Rc::clone(ledger),
        }
    }

    fn violation(&self, why: String) {
        self.ledger.borrow_mut().violations.push(why);
    }

    // --- submission, as a wire's own API does it ---

    /// `payload` back with the refusal of a stopped queue.
    fn open<T>(&self, payload: T) -> std::result::Result<T, SubmitError<T>> {
        match self.eng.stopped {
            Some(_) => Err(SubmitError {
                kind: SubmitErrorKind::ControllerFailed,
                buf: payload,
            }),
            None => Ok(payload),
        }
    }

    /// A slot for a command carrying `payload`, or the refusal.
    fn slot<T>(&mut self, payload: T) -> std::result::Result<(u16, T), SubmitError<T>> {
        let payload = self.open(payload)?;
        match self.eng.reserve() {
            Some(slot) => Ok((slot, payload)),
            None => Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf: payload,
            }),
        }
    }

    /// A read of one command into `buf` under `tag`.
    pub fn read(
        &mut self,
        tag: u64,
        buf: StubBuf,
    ) -> std::result::Result<(), SubmitError<StubBuf>> {
        let (slot, buf) = self.slot(buf)?;
        let hold = Arc::clone(&buf.state);
        let cid = self.eng.arm(slot, tag, Some(buf));
        self.ctrl.dev.borrow_mut().give(cid, tag, Some(hold));
        Ok(())
    }

    /// A command without data under `tag`.
    pub fn flush(&mut self, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        let (slot, ()) = self.slot(())?;
        let cid = self.eng.arm(slot, tag, None);
        self.ctrl.dev.borrow_mut().give(cid, tag, None);
        Ok(())
    }

    /// A read split into `children` commands of one block each.
    pub fn read_split(
        &mut self,
        tag: u64,
        buf: StubBuf,
        children: u32,
    ) -> std::result::Result<(), SubmitError<StubBuf>> {
        let buf = self.open(buf)?;
        let hold = Arc::clone(&buf.state);
        let r = SplitRequest {
            lba: 0,
            blocks: children,
            shift: 9,
            per_child: 1,
            tag,
        };
        let (p, scratch) = self.eng.plan_split(r, buf, |_, _| Ok(()))?;
        for (c, ()) in &scratch {
            self.eng.arm_child(c.slot, p, tag);
            let cid = self.eng.trackers.slot(c.slot).cid();
            self.ctrl
                .dev
                .borrow_mut()
                .give(cid, tag, Some(Arc::clone(&hold)));
        }
        self.eng.armed_split(scratch);
        Ok(())
    }

    /// A command of the wire's own (no application completion); whether
    /// a slot was free.
    pub fn internal(&mut self) -> bool {
        if self.eng.stopped.is_some() {
            return false;
        }
        let Some(slot) = self.eng.trackers.alloc() else {
            return false;
        };
        let cid = self
            .eng
            .trackers
            .arm(slot, INTERNAL_TAG, None, self.eng.timeouts.now_ms);
        self.internal[usize::from(slot)] = true;
        self.internal_busy += 1;
        self.ctrl.dev.borrow_mut().give(cid, INTERNAL_TAG, None);
        true
    }

    /// Close: every command ends once through `f`.
    pub fn close(mut self, mut f: impl FnMut(Completion<StubBuf>)) -> Result<()> {
        self.shutdown(&mut f)
    }

    // --- the device and the controller, as the script drives them ---

    /// The device posts the entry of its `pick`-th fetched command (if it
    /// has any and is live), then signals the queue's interrupt. A failed controller posts nothing more (the core has given up on
    /// what it holds).
    pub fn device_complete(&mut self, pick: usize, ok: bool) -> bool {
        if state::failure(self.ctrl.word.load()) != state::OK {
            return false;
        }
        let Some(tag) = self.ctrl.dev.borrow_mut().complete(pick, ok) else {
            return false;
        };
        self.ledger.borrow_mut().posted(tag, ok);
        if let Some(n) = self.eng.wait.irq.as_ref().and_then(|i| i.notifier()) {
            n.signal();
        }
        true
    }

    /// The device posts a stale or duplicate entry.
    pub fn device_stale(&mut self, seed: u16) {
        self.ctrl.dev.borrow_mut().stale(seed);
    }

    /// The controller fails now.
    pub fn fail(&mut self, disabled: bool, gone: bool) {
        self.ctrl.fail(disabled, gone);
    }

    /// A reset begins (it finishes when the queue next looks);
    /// `bring_up_ok`: the controller comes back.
    pub fn begin_reset(&mut self, bring_up_ok: bool) {
        let s = self.ctrl.word.load();
        if s & state::RESETTING != 0 {
            return;
        }
        self.ctrl
            .bring_up
            .set(if bring_up_ok { state::OK } else { state::FATAL });
        self.ctrl.word.begin_reset(s);
    }

    /// Commands submitted and not yet rung for.
    pub fn queued(&self) -> usize {
        self.ctrl.dev.borrow().queued.len()
    }

    /// The counters the suite compares with the ledger.
    pub fn check(&self) {
        let c = self.all_counters();
        let mut l = self.ledger.borrow_mut();
        let held = self.eng.held.len() as u64;
        let mut v = Vec::new();
        if c.completed != l.delivered + held {
            v.push(format!(
                "completed {} != delivered {} + held {held}",
                c.completed, l.delivered
            ));
        }
        if c.submitted != l.parts {
            v.push(format!("submitted {} != accepted {}", c.submitted, l.parts));
        }
        if c.stale_completions != self.stale_consumed {
            v.push(format!(
                "stale completions {} != stale entries consumed {}",
                c.stale_completions, self.stale_consumed
            ));
        }
        if c.doorbell_writes != self.doorbells {
            v.push(format!(
                "doorbells {} != {}",
                c.doorbell_writes, self.doorbells
            ));
        }
        if self.eng.trackers.outstanding() < self.internal_busy {
            v.push(format!(
                "{} slots busy, {} of them the wire's own",
                self.eng.trackers.outstanding(),
                self.internal_busy
            ));
        }
        let out = self.eng.outstanding(self.internal_busy);
        let least = l.sent.len();
        let most: usize = l.sent.values().map(|s| s.parts).sum();
        if out < least || out > most {
            v.push(format!(
                "outstanding {out} outside {least}..={most} (the commands not yet delivered)"
            ));
        }
        if held == 0 && (c.aborted_by_reset, c.failed_by_controller) != (l.by_reset, l.by_failure) {
            v.push(format!(
                "aborted by reset {} / failed by controller {} counted, {} / {} delivered",
                c.aborted_by_reset, c.failed_by_controller, l.by_reset, l.by_failure
            ));
        }
        l.violations.extend(v);
    }

    // --- hook helpers ---

    /// Consume one entry: prove it by its CID, end its command.
    fn take<F: FnMut(Completion<StubBuf>)>(&mut self, e: Entry, f: &mut F) -> bool {
        if e.stale {
            self.stale_consumed += 1;
        }
        let Some(slot) = self.eng.trackers.lookup(e.cid) else {
            self.eng.trackers.stale += 1;
            return false;
        };
        let internal = &mut self.internal;
        let busy = &mut self.internal_busy;
        self.eng.complete(
            slot,
            0,
            |_, _| if e.ok { Ok(()) } else { Err(device_error()) },
            |s, _| {
                let mine = std::mem::take(&mut internal[usize::from(s)]);
                *busy -= usize::from(mine);
                mine
            },
            f,
        )
    }

    fn pop(&self) -> Option<Entry> {
        self.ctrl.dev.borrow_mut().cq.pop_front()
    }
}

impl Wire for StubWire {
    type Buf = StubBuf;
    type Child = ();
    type Ctrl = StubCtrl;
    const HEALTH_CHECK_INTERVAL: u32 = 4;

    crate::core::qpair::wire_parts!(eng, ctrl);

    fn accesses(&self) -> (u64, u64) {
        (self.doorbells, 0)
    }

    fn ring(&mut self) -> bool {
        let s = self.ctrl.word.load();
        if s != self.eng.seen_state || self.eng.stopped.is_some() || s & state::RESETTING != 0 {
            self.violation(format!(
                "rang with the gate closed (word {s:#x}, seen {:#x}, stopped {:?})",
                self.eng.seen_state, self.eng.stopped
            ));
        }
        let mut d = self.ctrl.dev.borrow_mut();
        if d.queued.is_empty() {
            return false;
        }
        let q = std::mem::take(&mut d.queued);
        d.fetched.extend(q);
        self.doorbells += 1;
        true
    }

    fn reap<F: FnMut(Completion<StubBuf>)>(&mut self, max: usize, f: &mut F) -> Reaped {
        if let Some(k) = self.complete_at_reap {
            if k == 0 {
                self.complete_at_reap = None;
                self.device_complete(0, true);
            } else {
                self.complete_at_reap = Some(k - 1);
            }
        }
        let suspect = std::mem::take(&mut self.suspect);
        let (mut seen, mut delivered) = (0, 0);
        while seen < max {
            let Some(e) = self.pop() else { break };
            seen += 1;
            if self.take(e, f) {
                delivered += 1;
            }
        }
        Reaped {
            seen,
            delivered,
            suspect,
        }
    }

    fn check_controller(&mut self) {
        self.health_looks += 1;
        if let Some((disabled, gone)) = self.health_failure.take() {
            self.ctrl.fail(disabled, gone);
        }
    }

    fn scan_timeouts(&mut self, _drained: bool, f: &mut dyn FnMut(Completion<StubBuf>)) {
        self.timeout_scans += 1;
        self.eng.timeouts.begin_scan();
        let mut f = f;
        while self.expire > 0 {
            let Some(c) = self.ctrl.dev.borrow_mut().fetched.pop() else {
                break;
            };
            self.expire -= 1;
            let cid = c.cid;
            c.release();
            let Some(slot) = self.eng.trackers.lookup(cid) else {
                self.violation(format!("a fetched command (cid {cid:#x}) has no slot"));
                continue;
            };
            let internal = &mut self.internal;
            let busy = &mut self.internal_busy;
            self.eng.complete(
                slot,
                0,
                |_, _| Err(IoError::TimedOut),
                |s, _| {
                    let mine = std::mem::take(&mut internal[usize::from(s)]);
                    *busy -= usize::from(mine);
                    mine
                },
                &mut f,
            );
        }
    }

    fn deliver_posted(&mut self, f: &mut dyn FnMut(Completion<StubBuf>)) -> usize {
        let mut f = f;
        let mut n = 0;
        while let Some(e) = self.pop() {
            if self.take(e, &mut f) {
                n += 1;
            }
        }
        n
    }

    fn end_internal(&mut self, _keep_bufs: bool) -> u64 {
        for slot in 0..self.internal.len() {
            if self.internal[slot] && self.eng.trackers.slot(slot as u16).busy() {
                self.eng.trackers.complete(slot as u16);
                self.internal[slot] = false;
                self.internal_busy -= 1;
            }
        }
        0
    }

    fn forget(&mut self) {
        let mut d = self.ctrl.dev.borrow_mut();
        let d = &mut *d;
        d.cq.clear();
        for c in d.queued.drain(..).chain(d.fetched.drain(..)) {
            if c.held {
                d.abandoned.push(c);
            }
        }
    }

    fn recreate(&mut self, settled: u64) -> Recreated {
        match self.recreate.pop_front().unwrap_or(Recreate::Yes) {
            Recreate::Yes => {
                self.ctrl.dev.borrow_mut().live = true;
                Recreated::Yes(settled)
            }
            Recreate::Moved => {
                self.ctrl.dev.borrow_mut().disable();
                self.ctrl.word.store(state::next(settled, state::OK));
                Recreated::Moved
            }
            Recreate::Failed { left } => {
                self.ctrl.dev.borrow_mut().live = left;
                Recreated::Failed {
                    error: "scripted".into(),
                    left,
                }
            }
        }
    }

    fn note_leak(&self, bytes: u64) {
        self.leaked.set(self.leaked.get() + bytes);
    }

    fn queue_id(&self) -> u16 {
        1
    }

    fn stopped_error(&self, s: Stopped) -> Error {
        match s {
            Stopped::Fatal => Error::ControllerFatal,
            Stopped::Gone => Error::DeviceGone,
            Stopped::Lost => Error::QueueLost { qid: 1 },
        }
    }

    fn withdraw_all(&mut self, f: &mut dyn FnMut(Completion<StubBuf>)) -> Result<bool> {
        match self.withdraw {
            Withdraw::Confirmed(k) => {
                for _ in 0..k {
                    // Counted down first: after a panic in `f` the next
                    // call carries on, it does not post again.
                    if let Withdraw::Confirmed(k) = &mut self.withdraw {
                        *k -= 1;
                    }
                    self.device_complete(0, false);
                }
                self.deliver_posted(f);
                self.ctrl.dev.borrow_mut().disable();
                Ok(true)
            }
            Withdraw::Unconfirmed => Ok(false),
            Withdraw::Refused => Err(Error::Timeout {
                what: "scripted withdrawal",
                timeout_ms: 0,
            }),
            Withdraw::Reset => {
                let s = self.ctrl.word.load();
                self.ctrl.dev.borrow_mut().disable();
                self.ctrl.word.store(state::next(s, state::OK));
                Err(Error::Timeout {
                    what: "scripted withdrawal",
                    timeout_ms: 0,
                })
            }
        }
    }

    fn closed(&mut self, gone: bool) {
        self.closed = Some(gone);
    }
}

impl Drop for StubWire {
    /// As a wire's `Drop`: carry closing on (after a panic in `close`'s
    /// callback, or without a close); what ends here reaches the ledger
    /// without scripted panics.
    fn drop(&mut self) {
        let ledger = Rc::clone(&self.ledger);
        ledger.borrow_mut().panic_in = None;
        let _ = self.shutdown(&mut |c| Ledger::deliver(&ledger, c));
    }
}
