//! One ublk queue served by one engine queue pair, on one thread: the
//! request mapping and the per-tag state machine.
//!
//! ```text
//!            fetch                 OK completion              submitted
//!   Idle ──────────▶ Fetching ───────────────────▶ (map) ──────────────▶ InEngine
//!                     ▲   │ ABORT                   │ │ QueueFull            │
//!                     │   ▼                         │ ▼                      │ completion
//!                     │  Dead                       │ Waiting ──(room)───────┤ (retry if the
//!                     │                             │ refused / bad request  │  engine says so)
//!                     │ commit (+fetch)             ▼                        ▼
//!                     └──────────────────────────── Commit(result) ◀─────────┘
//! ```
//!
//! Every request the kernel hands over is answered by exactly one commit:
//! a commit is queued only from `Commit`, a tag reaches `Commit` once per
//! request, and an engine completion is accepted only by the tag in
//! `InEngine` whose request serial it carries (the engine tag is
//! `serial << 16 | tag`). Anything else is counted in
//! [`Stats::protocol_errors`] and dropped; the tests require it to be 0.
//!
//! The loop ([`Server::run`]) peeks both completion rings without a
//! system call, rings the engine's doorbell once per batch and enters the
//! kernel once per batch of commits (none when a pass queued no commit:
//! new requests arrive as task work the kernel runs on this thread's
//! next return to user space, no system call needed).
//!
//! ## Idle: one sleep for both sides
//!
//! A pass that found nothing on either ring is idle. After spinning for
//! [`Idle::spin`] since the last work, the thread sleeps in one
//! `io_uring_enter(min_complete = 1)` on the ublk ring:
//!
//! - the engine owes nothing: until the kernel hands over a request;
//! - the engine owes completions and its queue pair has an interrupt
//!   (its wait policy is `irq` or `hybrid`): the server **arms** the
//!   interrupt (clears its eventfd; on NVMe/TCP makes the next poll
//!   receive), **polls** the engine once more, and only if that finds
//!   nothing queues a one-shot poll of the interrupt's descriptor on the
//!   same ring and **sleeps** — until a request or the interrupt,
//!   whichever comes first, at most the engine's slice (10 ms; after a
//!   slice that ran out the engine checks its timeouts and the
//!   controller's health, and an NVMe/TCP controller sends its Keep Alive
//!   when due). No wake-up is lost: a completion the second poll missed
//!   raises its interrupt after the arm, so the eventfd is readable when
//!   the poll is queued or becomes so later, and either way the poll
//!   completes (the engine's `core::qpair::wait` explains why the arm
//!   cannot swallow it). On NVMe/TCP the descriptor is the queue pair's
//!   epoll set holding its connection: readable while an answer waits in
//!   the socket, level-triggered, and the same descriptor across
//!   reconnects, so a pending one-shot poll stays valid.
//! - the engine owes completions and polls only: no sleep; the thread
//!   spins on both rings, yielding the CPU now and then.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::vfio::{DmaDir, DmaSpace};
use mcqio::{Completion, DmaBuf};

mod request;

use crate::queue::{UblkQueue, Wait};
use crate::sys;
use crate::target::{errno_of, refusal_errno, retriable, Caps, Target};

use request::success;
pub use request::{map_request, Request};

/// How often a request the engine says may be resent is resent before
/// its error goes to the kernel.
pub const MAX_RETRIES: u8 = 3;

/// Empty passes between two readings of the clock while spinning.
const SPINS_PER_CLOCK: u32 = 32;
/// Empty passes between two yields of a thread that cannot sleep (the
/// engine owes completions and has no interrupt).
const SPINS_PER_YIELD: u32 = 64;
/// How long one idle sleep lasts at most when the engine owes nothing
/// (the stop flag is checked after).
const SLEEP: Duration = Duration::from_millis(200);

/// How an idle server thread waits.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Idle {
    /// Spin this long after the last work before sleeping.
    pub spin: Duration,
    /// Whether to sleep while the engine owes completions (on its
    /// interrupt, when it has one); `false` spins until they come.
    pub sleep_on_engine: bool,
}

impl Idle {
    /// The server's idle behaviour for the engine's wait policy: `poll`
    /// spins while the engine owes completions (and sleeps after a short
    /// spin when it owes none), `irq` sleeps at once, `hybrid:SPIN` spins
    /// SPIN after the last work, then sleeps.
    pub fn of(policy: mcqio::WaitPolicy) -> Idle {
        match policy {
            mcqio::WaitPolicy::Poll => Idle {
                spin: Duration::from_micros(100),
                sleep_on_engine: false,
            },
            mcqio::WaitPolicy::Interrupt => Idle {
                spin: Duration::ZERO,
                sleep_on_engine: true,
            },
            mcqio::WaitPolicy::Hybrid { spin } => Idle {
                spin,
                sleep_on_engine: true,
            },
        }
    }
}

impl Default for Idle {
    fn default() -> Self {
        Idle::of(mcqio::WaitPolicy::Poll)
    }
}
/// How long [`Server::finish`] waits for the engine's last completions.
const FINISH_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum State {
    /// Not fetched yet.
    Idle,
    /// A FETCH or COMMIT_AND_FETCH is with the kernel.
    Fetching,
    /// Mapped, waiting for room in the engine's queue.
    Waiting,
    /// With the engine.
    InEngine,
    /// Answered, the commit not yet queued.
    Commit(i32),
    /// Aborted by the kernel: never fetched again.
    Dead,
}

struct Tag {
    state: State,
    /// The tag's DMA buffer; `None` while the engine has it.
    buf: Option<DmaBuf>,
    /// Its address, given to the kernel with every FETCH / COMMIT.
    addr: u64,
    req: Option<Request>,
    serial: u32,
    tries: u8,
}

/// Counters of one queue.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests the kernel handed over.
    pub requests: u64,
    /// Commits queued (answers to requests).
    pub commits: u64,
    /// Answers that were errors.
    pub errors: u64,
    /// Requests resent to the engine after a retriable error.
    pub retries: u64,
    /// Times a request waited because the engine's queue was full.
    pub queue_full: u64,
    /// Tags aborted by the kernel.
    pub aborted: u64,
    /// Completions that matched no request in the state that expects them
    /// (a kernel completion for a tag that is not fetching, an engine
    /// completion for a tag or serial not with the engine): 0 always.
    pub protocol_errors: u64,
    /// System calls into the ublk ring (`io_uring_enter`).
    pub enters: u64,
    /// Times the idle thread slept in the kernel.
    pub sleeps: u64,
    /// Of those, sleeps while the engine owed completions (on its
    /// interrupt and the ublk ring at once).
    pub engine_sleeps: u64,
    /// Engine sleeps its interrupt ended.
    pub engine_wakeups: u64,
    /// Engine sleeps that ran out their slice.
    pub engine_ran_out: u64,
    /// Engine completions collected by [`Server::finish`] after the
    /// kernel had aborted their tags.
    pub late_completions: u64,
}

/// One ublk queue `Q` served by one engine queue pair `T`.
pub struct Server<'a, Q: UblkQueue, T: Target> {
    q: Q,
    t: &'a mut T,
    at: T::Addr,
    caps: Caps,
    space: Arc<DmaSpace>,
    tags: Vec<Tag>,
    waiting: VecDeque<u16>,
    commits_queued: usize,
    live: usize,
    stats: Stats,
    idle: Idle,
    /// Scratch for one pass (kept: nothing is allocated per I/O).
    arrived: Vec<(u16, i32)>,
    done: Vec<Completion<DmaBuf>>,
}

impl<'a, Q: UblkQueue, T: Target> Server<'a, Q, T> {
    /// A server for `q` on `t`'s unit `at`, with one buffer of
    /// `caps.max_io` bytes per tag allocated now from the engine's DMA
    /// `space` (nothing is allocated per I/O).
    pub fn new(
        q: Q,
        t: &'a mut T,
        at: T::Addr,
        caps: Caps,
        space: Arc<DmaSpace>,
    ) -> io::Result<Self> {
        let depth = usize::from(q.depth());
        let mut tags = Vec::with_capacity(depth);
        for _ in 0..depth {
            let b = DmaBuf::alloc(&space, caps.max_io as usize, DmaDir::Bidirectional).map_err(
                |e| {
                    io::Error::other(format!(
                        "tag buffers ({depth} x {} bytes): {e}",
                        caps.max_io
                    ))
                },
            )?;
            tags.push(Tag {
                state: State::Idle,
                addr: b.as_slice().as_ptr() as u64,
                buf: Some(b),
                req: None,
                serial: 0,
                tries: 0,
            });
        }
        Ok(Server {
            q,
            t,
            at,
            caps,
            space,
            tags,
            waiting: VecDeque::new(),
            commits_queued: 0,
            live: depth,
            stats: Stats::default(),
            idle: Idle::default(),
            arrived: Vec::with_capacity(depth),
            done: Vec::with_capacity(depth),
        })
    }

    /// Set how the thread waits when idle (default: [`Idle::default`]).
    pub fn set_idle(&mut self, idle: Idle) {
        self.idle = idle;
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The ublk queue (tests look at the fake through it).
    pub fn queue(&self) -> &Q {
        &self.q
    }

    /// The ublk queue, mutably (tests feed the fake through it).
    pub fn queue_mut(&mut self) -> &mut Q {
        &mut self.q
    }

    /// Tags the kernel has not aborted.
    pub fn live_tags(&self) -> usize {
        self.live
    }

    /// A summary of the tags' states and requests, for diagnostics.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "queue {}: {} live tags, {} engine commands outstanding, {} waiting;",
            self.q.qid(),
            self.live,
            self.t.outstanding(),
            self.waiting.len()
        );
        for (i, t) in self.tags.iter().enumerate() {
            if !matches!(t.state, State::Fetching | State::Dead | State::Idle) {
                out += &format!(" tag {i}: {:?} {:?} (try {});", t.state, t.req, t.tries);
            }
        }
        out
    }

    /// Engine commands outstanding.
    pub fn outstanding(&self) -> usize {
        self.t.outstanding()
    }

    fn addr_for_kernel(&self, tag: u16) -> u64 {
        if self.q.user_copy() {
            0
        } else {
            self.tags[usize::from(tag)].addr
        }
    }

    /// Queue the first FETCH of every tag and hand them to the kernel.
    pub fn start(&mut self) -> io::Result<()> {
        for tag in 0..self.q.depth() {
            let addr = self.addr_for_kernel(tag);
            self.q.fetch(tag, addr)?;
            self.tags[usize::from(tag)].state = State::Fetching;
        }
        self.stats.enters += 1;
        self.q.submit(Wait::No).map(drop)
    }

    /// One pass: take the kernel's new requests, send them on, ring the
    /// engine, take its completions, queue the commits and enter the
    /// kernel once if anything is queued. Returns how much happened
    /// (requests + engine completions).
    pub fn step(&mut self) -> io::Result<usize> {
        let mut arrived = std::mem::take(&mut self.arrived);
        self.q.reap(&mut |tag, res| arrived.push((tag, res)));
        let mut work = arrived.len();
        let r = arrived
            .drain(..)
            .try_for_each(|(tag, res)| self.on_kernel(tag, res));
        self.arrived = arrived;
        r?;
        self.retry_waiting()?;
        self.t.submit();
        let mut done = std::mem::take(&mut self.done);
        let max = self.tags.len();
        let polled = self.t.poll(max, |c| done.push(c));
        work += done.len();
        let r = self.engine_done(&mut done, polled);
        self.done = done;
        r?;
        self.flush_commits()?;
        Ok(work)
    }

    /// Take what a poll of the engine delivered into `done`.
    fn engine_done(
        &mut self,
        done: &mut Vec<Completion<DmaBuf>>,
        polled: mcqio::Result<usize>,
    ) -> io::Result<()> {
        let r = done.drain(..).try_for_each(|c| self.on_engine(c));
        if let Err(e) = polled {
            // The queue pair cannot go on (controller gone).
            eprintln!(
                "mcqio-ublk: queue {}: engine poll failed: {e}",
                self.q.qid()
            );
            return Err(io::Error::other(e.to_string()));
        }
        r?;
        self.retry_waiting()?;
        self.t.submit();
        Ok(())
    }

    fn on_kernel(&mut self, tag: u16, res: i32) -> io::Result<()> {
        let Some(t) = self.tags.get_mut(usize::from(tag)) else {
            self.stats.protocol_errors += 1;
            return Ok(());
        };
        if t.state != State::Fetching {
            self.stats.protocol_errors += 1;
            return Ok(());
        }
        match res {
            sys::IO_RES_OK => {
                self.stats.requests += 1;
                t.serial = t.serial.wrapping_add(1) & 0xffff;
                t.tries = 0;
                let d = self.q.desc(tag);
                match map_request(&d, &self.caps) {
                    Ok(r) => {
                        if let Request::Write { bytes, .. } = r {
                            // USER_COPY: the data comes now (copy mode: it
                            // is already in the buffer).
                            let t = &mut self.tags[usize::from(tag)];
                            let buf = t.buf.as_mut().expect("a fetching tag holds its buffer");
                            if let Err(e) = self
                                .q
                                .copy_in(tag, &mut buf.as_mut_slice()[..bytes as usize])
                            {
                                eprintln!(
                                    "mcqio-ublk: queue {} tag {tag}: user copy in: {e}",
                                    self.q.qid()
                                );
                                self.answer(tag, -libc::EIO);
                                return Ok(());
                            }
                        }
                        self.tags[usize::from(tag)].req = Some(r);
                        self.issue(tag)?;
                    }
                    Err(errno) => self.answer(tag, errno),
                }
            }
            sys::IO_RES_ABORT => {
                t.state = State::Dead;
                self.live -= 1;
                self.stats.aborted += 1;
            }
            e => {
                // A FETCH / COMMIT the driver refused: the tag is not ours
                // to use any more; say why once.
                eprintln!(
                    "mcqio-ublk: queue {} tag {tag}: the driver refused the command: {}",
                    self.q.qid(),
                    io::Error::from_raw_os_error(-e)
                );
                t.state = State::Dead;
                self.live -= 1;
                self.stats.aborted += 1;
            }
        }
        Ok(())
    }

    fn answer(&mut self, tag: u16, result: i32) {
        let t = &mut self.tags[usize::from(tag)];
        t.state = State::Commit(result);
        t.req = None;
        self.commits_queued += 1;
        if result < 0 {
            self.stats.errors += 1;
        }
    }

    /// Send `tag`'s request to the engine (or park it if there is no room).
    fn issue(&mut self, tag: u16) -> io::Result<()> {
        let i = usize::from(tag);
        let req = self.tags[i].req.expect("a tag being issued has a request");
        let etag = (u64::from(self.tags[i].serial) << 16) | u64::from(tag);
        let at = self.at;
        let refused: Option<mcqio::SubmitErrorKind> = match req {
            Request::Read { lba, blocks, .. } => {
                let buf = self.tags[i]
                    .buf
                    .take()
                    .expect("an idle tag holds its buffer");
                match self.t.read(at, lba, blocks, buf, etag) {
                    Ok(()) => None,
                    Err(e) => {
                        self.tags[i].buf = Some(e.buf);
                        Some(e.kind)
                    }
                }
            }
            Request::Write {
                lba, blocks, fua, ..
            } => {
                let buf = self.tags[i]
                    .buf
                    .take()
                    .expect("an idle tag holds its buffer");
                let r = if fua {
                    self.t.write_fua(at, lba, blocks, buf, etag)
                } else {
                    self.t.write(at, lba, blocks, buf, etag)
                };
                match r {
                    Ok(()) => None,
                    Err(e) => {
                        self.tags[i].buf = Some(e.buf);
                        Some(e.kind)
                    }
                }
            }
            Request::Flush => self.t.flush(at, etag).err().map(|e| e.kind),
            Request::Discard { lba, blocks } => self
                .t
                .deallocate(at, lba, blocks, etag)
                .err()
                .map(|e| e.kind),
            Request::WriteZeroes { lba, blocks } => self
                .t
                .write_zeroes(at, lba, blocks, etag)
                .err()
                .map(|e| e.kind),
        };
        match refused {
            None => self.tags[i].state = State::InEngine,
            Some(k) => match refusal_errno(&k) {
                None => {
                    if self.tags[i].state != State::Waiting {
                        self.tags[i].state = State::Waiting;
                        self.waiting.push_back(tag);
                        self.stats.queue_full += 1;
                    }
                }
                // A waiting tag leaves the queue in `retry_waiting`.
                Some(errno) => self.answer(tag, errno),
            },
        }
        Ok(())
    }

    fn retry_waiting(&mut self) -> io::Result<()> {
        while let Some(&tag) = self.waiting.front() {
            if self.t.is_full() {
                break;
            }
            self.issue(tag)?;
            if self.tags[usize::from(tag)].state == State::Waiting {
                break; // still no room (a split needs several slots)
            }
            self.waiting.pop_front();
        }
        Ok(())
    }

    fn on_engine(&mut self, c: Completion<DmaBuf>) -> io::Result<()> {
        let tag = (c.tag & 0xffff) as u16;
        let serial = (c.tag >> 16) as u32;
        let i = usize::from(tag);
        let valid = self
            .tags
            .get(i)
            .is_some_and(|t| t.state == State::InEngine && t.serial == serial);
        if !valid {
            self.stats.protocol_errors += 1;
            return Ok(());
        }
        let req = self.tags[i]
            .req
            .expect("a tag with the engine has a request");
        let had_buf = matches!(req, Request::Read { .. } | Request::Write { .. });
        if had_buf {
            match c.buf {
                Some(b) => self.tags[i].buf = Some(b),
                None => {
                    // The engine kept the buffer (the device may still
                    // reach it): the tag gets a new one, and a write's
                    // data is gone with the old.
                    return self.replace_lost_buffer(tag, req, c.result.err());
                }
            }
        }
        match c.result {
            Ok(()) => {
                if let Request::Read { bytes, .. } = req {
                    let buf = self.tags[i].buf.as_ref().expect("returned above");
                    if let Err(e) = self.q.copy_out(tag, &buf.as_slice()[..bytes as usize]) {
                        eprintln!(
                            "mcqio-ublk: queue {} tag {tag}: user copy out: {e}",
                            self.q.qid()
                        );
                        self.answer(tag, -libc::EIO);
                        return Ok(());
                    }
                }
                self.answer(tag, success(&req));
            }
            Err(e) if retriable(&e) && self.tags[i].tries < MAX_RETRIES => {
                self.tags[i].tries += 1;
                self.stats.retries += 1;
                self.tags[i].state = State::Fetching; // neither waiting nor with the engine
                self.issue(tag)?;
            }
            Err(e) => self.answer(tag, errno_of(&e)),
        }
        Ok(())
    }

    fn replace_lost_buffer(
        &mut self,
        tag: u16,
        req: Request,
        err: Option<mcqio::IoError>,
    ) -> io::Result<()> {
        let i = usize::from(tag);
        let fresh = DmaBuf::alloc(
            &self.space,
            self.caps.max_io as usize,
            DmaDir::Bidirectional,
        )
        .map_err(|e| io::Error::other(format!("replacing a lost tag buffer: {e}")))?;
        self.tags[i].addr = fresh.as_slice().as_ptr() as u64;
        self.tags[i].buf = Some(fresh);
        let errno = err.as_ref().map_or(-libc::EIO, errno_of);
        match (req, err) {
            (Request::Read { .. }, Some(e))
                if retriable(&e) && self.tags[i].tries < MAX_RETRIES =>
            {
                self.tags[i].tries += 1;
                self.stats.retries += 1;
                self.tags[i].state = State::Fetching;
                self.issue(tag)
            }
            _ => {
                self.answer(tag, errno);
                Ok(())
            }
        }
    }

    fn flush_commits(&mut self) -> io::Result<()> {
        if self.commits_queued == 0 {
            return Ok(());
        }
        for tag in 0..self.q.depth() {
            if let State::Commit(res) = self.tags[usize::from(tag)].state {
                let addr = self.addr_for_kernel(tag);
                self.q.commit(tag, res, addr)?;
                self.tags[usize::from(tag)].state = State::Fetching;
                self.stats.commits += 1;
            }
        }
        self.commits_queued = 0;
        self.stats.enters += 1;
        self.q.submit(Wait::No).map(drop)
    }

    /// Serve until every tag is aborted (the device was stopped or
    /// deleted) and the engine has nothing outstanding, or until `stop`
    /// is set and the queue is idle.
    pub fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut empty = 0u32;
        let mut last_work = Instant::now();
        loop {
            let work = self.step()?;
            if self.live == 0 && self.t.outstanding() == 0 && self.waiting.is_empty() {
                return Ok(());
            }
            if work > 0 {
                empty = 0;
                continue;
            }
            if empty == 0 {
                last_work = Instant::now();
            }
            empty = empty.wrapping_add(1);
            let owed = self.t.outstanding() > 0 || !self.waiting.is_empty();
            if !owed && stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if empty % SPINS_PER_CLOCK != 0 {
                std::hint::spin_loop();
                continue;
            }
            if last_work.elapsed() < self.idle.spin {
                continue;
            }
            if owed && (!self.idle.sleep_on_engine || self.t.interrupt().is_none()) {
                // Nothing to sleep on: the engine is polled only.
                if empty % SPINS_PER_YIELD == 0 {
                    std::thread::yield_now();
                }
                continue;
            }
            if self.idle_sleep()? {
                empty = 0;
            }
        }
    }

    /// One idle sleep (see the module docs): on the ublk ring alone when
    /// the engine owes nothing, on the ring and the engine's interrupt
    /// when it does. Returns whether work arrived (or may have).
    pub fn idle_sleep(&mut self) -> io::Result<bool> {
        let owed = self.t.outstanding() > 0 || !self.waiting.is_empty();
        if !owed {
            self.stats.sleeps += 1;
            self.stats.enters += 1;
            let ran_out = self.q.submit(Wait::One(SLEEP))?;
            return Ok(!ran_out);
        }
        // Arm (the engine's wait policy decides: `None` while a hybrid spin
        // runs, or on a polled queue), poll again, and only then sleep.
        let Some(sleep) = self.t.arm_sleep() else {
            return Ok(false);
        };
        let mut done = std::mem::take(&mut self.done);
        let polled = self.t.poll(self.tags.len(), &mut |c| done.push(c));
        let n = done.len();
        let r = self.engine_done(&mut done, polled);
        self.done = done;
        r?;
        if n > 0 {
            self.flush_commits()?;
            return Ok(true);
        }
        self.q.watch(sleep.interrupt.as_fd().as_raw_fd())?;
        self.stats.sleeps += 1;
        self.stats.engine_sleeps += 1;
        self.stats.enters += 1;
        let ran_out = self.q.submit(Wait::One(sleep.slice))?;
        // Take what ended the sleep now: the watch's completion (for the
        // engine's count) and any requests, sent on with the next pass.
        let mut arrived = std::mem::take(&mut self.arrived);
        self.q.reap(&mut |tag, res| arrived.push((tag, res)));
        let r = arrived
            .drain(..)
            .try_for_each(|(tag, res)| self.on_kernel(tag, res));
        self.arrived = arrived;
        r?;
        let woken = self.q.take_woken();
        if woken {
            self.stats.engine_wakeups += 1;
        }
        if ran_out {
            self.stats.engine_ran_out += 1;
        }
        self.t.slept(woken);
        Ok(true)
    }

    /// Wait (polling, at most `FINISH_TIMEOUT`) until the engine has
    /// nothing outstanding — every buffer back, so none is freed while
    /// the device may reach it — and hand back the ublk queue with the
    /// counters. Completions that arrive now belong to requests whose tags
    /// the kernel already aborted, so they are only counted.
    pub fn finish(mut self) -> (Q, Stats) {
        let deadline = std::time::Instant::now() + FINISH_TIMEOUT;
        while self.t.outstanding() > 0 && std::time::Instant::now() < deadline {
            self.t.submit();
            let mut n = 0u64;
            if self.t.poll(self.tags.len(), |_| n += 1).is_err() {
                break;
            }
            self.stats.late_completions += n;
            std::thread::yield_now();
        }
        (self.q, self.stats)
    }
}
