//! [`FakeQueue`]: the kernel's side of one ublk queue, in memory, for
//! `cargo test` without a ublk driver.
//!
//! It keeps the driver's per-tag protocol and checks the server against
//! it: a request can be handed only to a tag whose fetch is with the
//! "kernel", a commit is accepted only for a tag holding a request, each
//! request gets exactly one answer, and a command that breaks this panics
//! (a test failure, with the tag and what was wrong). Data moves the way
//! USER_COPY moves it — the server calls `copy_in` / `copy_out` — so the
//! fake sees exactly the bytes a READ returns and gives a WRITE its
//! bytes; in copy mode the real driver does the same copies itself
//! through the address given with each command.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::queue::{UblkQueue, Wait};
use crate::sys::{self, IoDesc};

#[derive(Clone, Debug, PartialEq, Eq)]
enum KState {
    /// Nothing from the server yet.
    Unfetched,
    /// The server's FETCH is queued in the SQ, not yet submitted.
    Queued,
    /// Fetch submitted: the tag can take a request.
    Ready,
    /// A request was handed over (its completion may not be reaped yet).
    Busy,
    /// The answer is queued, not yet submitted.
    Answered,
    /// Aborted.
    Gone,
}

/// One answered request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The tag.
    pub tag: u16,
    /// The descriptor it answered.
    pub desc: IoDesc,
    /// The result committed.
    pub result: i32,
    /// For a READ: the bytes the server handed out.
    pub data: Option<Vec<u8>>,
}

/// The fake queue.
pub struct FakeQueue {
    qid: u16,
    state: Vec<KState>,
    descs: Vec<IoDesc>,
    /// WRITE payloads of the requests being handed over.
    write_data: Vec<Option<Vec<u8>>>,
    read_data: Vec<Option<Vec<u8>>>,
    /// Commits queued in the SQ (tag, result), not yet submitted.
    sq: Vec<(u16, i32, u64)>,
    /// Completions the server has not reaped: (tag, result).
    cq: VecDeque<(u16, i32)>,
    answers: Vec<Answer>,
    /// The device was stopped: no tag gets a request any more.
    stopped: bool,
    /// `io_uring_enter`s seen.
    pub enters: u64,
    /// The fd a [`UblkQueue::watch`] asked about, until it is readable.
    watched: Option<RawFd>,
    woken: bool,
    /// Waits ([`Wait::One`]) that ended because the watched fd became
    /// readable, and those that ran out.
    pub watch_wakeups: u64,
    /// See [`watch_wakeups`](Self::watch_wakeups).
    pub waits_ran_out: u64,
    /// When set, a [`Wait::One`] on a watched fd lasts this long whatever
    /// time it asks for, so only the fd can end it early (a lost wake-up
    /// then shows as a wait that ran out).
    pub long_waits: Option<Duration>,
}

impl FakeQueue {
    /// A queue `qid` with `depth` tags.
    pub fn new(qid: u16, depth: u16) -> Self {
        let d = usize::from(depth);
        FakeQueue {
            qid,
            state: vec![KState::Unfetched; d],
            descs: vec![IoDesc::default(); d],
            write_data: vec![None; d],
            read_data: vec![None; d],
            sq: Vec::new(),
            cq: VecDeque::new(),
            answers: Vec::new(),
            stopped: false,
            enters: 0,
            watched: None,
            woken: false,
            watch_wakeups: 0,
            waits_ran_out: 0,
            long_waits: None,
        }
    }

    /// Tags that can take a request now.
    pub fn ready_tags(&self) -> Vec<u16> {
        (0..self.state.len())
            .filter(|&t| self.state[t] == KState::Ready)
            .map(|t| t as u16)
            .collect()
    }

    /// Hand a request to a ready `tag` (with its data for a WRITE), as the
    /// driver does when the block layer queues one.
    pub fn request(&mut self, tag: u16, desc: IoDesc, data: Option<Vec<u8>>) {
        let t = usize::from(tag);
        assert!(!self.stopped, "a request after the stop");
        assert_eq!(
            self.state[t],
            KState::Ready,
            "the test handed tag {tag} a request while it was {:?}",
            self.state[t]
        );
        if desc.op() == sys::IO_OP_WRITE {
            assert_eq!(
                data.as_ref().map(Vec::len),
                Some(desc.nr_sectors as usize * 512),
                "a WRITE needs its data"
            );
        }
        self.descs[t] = desc;
        self.write_data[t] = data;
        self.read_data[t] = None;
        self.state[t] = KState::Busy;
        self.cq.push_back((tag, sys::IO_RES_OK));
    }

    /// Stop the device: every tag waiting for a request is aborted; tags
    /// holding one are aborted when their answer arrives.
    pub fn abort(&mut self) {
        self.stopped = true;
        for t in 0..self.state.len() {
            if self.state[t] == KState::Ready {
                self.state[t] = KState::Gone;
                self.cq.push_back((t as u16, sys::IO_RES_ABORT));
            }
        }
    }

    /// Whether every tag is aborted.
    pub fn all_gone(&self) -> bool {
        self.state.iter().all(|s| *s == KState::Gone)
    }

    /// Take the answers so far.
    pub fn take_answers(&mut self) -> Vec<Answer> {
        std::mem::take(&mut self.answers)
    }

    /// Requests handed over and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.state
            .iter()
            .filter(|s| matches!(s, KState::Busy | KState::Answered))
            .count()
    }

    fn stopping(&self) -> bool {
        self.stopped
    }
}

impl UblkQueue for FakeQueue {
    fn qid(&self) -> u16 {
        self.qid
    }
    fn depth(&self) -> u16 {
        self.state.len() as u16
    }
    fn user_copy(&self) -> bool {
        true
    }
    fn desc(&self, tag: u16) -> IoDesc {
        let t = usize::from(tag);
        assert_eq!(
            self.state[t],
            KState::Busy,
            "descriptor of tag {tag} read while it holds no request"
        );
        self.descs[t]
    }

    fn fetch(&mut self, tag: u16, addr: u64) -> io::Result<()> {
        let t = usize::from(tag);
        assert_eq!(
            self.state[t],
            KState::Unfetched,
            "second FETCH of tag {tag}"
        );
        assert_eq!(addr, 0, "USER_COPY: FETCH carries no address");
        self.state[t] = KState::Queued;
        Ok(())
    }

    fn commit(&mut self, tag: u16, result: i32, addr: u64) -> io::Result<()> {
        let t = usize::from(tag);
        assert_eq!(
            self.state[t],
            KState::Busy,
            "COMMIT of tag {tag} which holds no request (answered twice, or never asked)"
        );
        assert_eq!(addr, 0, "USER_COPY: COMMIT carries no address");
        self.state[t] = KState::Answered;
        self.sq.push((tag, result, addr));
        Ok(())
    }

    fn submit(&mut self, wait: Wait) -> io::Result<bool> {
        self.enters += 1;
        let stopping = self.stopping();
        for (t, s) in self.state.iter_mut().enumerate() {
            if *s == KState::Queued {
                if stopping {
                    *s = KState::Gone;
                    self.cq.push_back((t as u16, sys::IO_RES_ABORT));
                } else {
                    *s = KState::Ready;
                }
            }
        }
        for (tag, result, _) in std::mem::take(&mut self.sq) {
            let t = usize::from(tag);
            let desc = self.descs[t];
            let data = if result >= 0 && desc.op() == sys::IO_OP_READ {
                let d = self.read_data[t].take();
                assert!(
                    d.as_ref().map(Vec::len) == Some(result as usize),
                    "READ of tag {tag} answered {result} without handing out that many bytes"
                );
                d
            } else {
                None
            };
            self.answers.push(Answer {
                tag,
                desc,
                result,
                data,
            });
            if stopping {
                self.state[t] = KState::Gone;
                self.cq.push_back((tag, sys::IO_RES_ABORT));
            } else {
                self.state[t] = KState::Ready;
            }
        }
        let Wait::One(time) = wait else {
            return Ok(false);
        };
        if !self.cq.is_empty() {
            return Ok(false);
        }
        // Nothing else can hand this queue a request while the test's
        // thread waits here: only a watched fd can end the wait early.
        let Some(fd) = self.watched else {
            self.waits_ran_out += 1;
            return Ok(true);
        };
        let ms = self
            .long_waits
            .unwrap_or(time)
            .as_millis()
            .min(i32::MAX as u128) as i32;
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is one live pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if r == 1 && p.revents & libc::POLLIN != 0 {
            self.watched = None;
            self.woken = true;
            self.watch_wakeups += 1;
            Ok(false)
        } else {
            self.waits_ran_out += 1;
            Ok(true)
        }
    }

    fn watch(&mut self, fd: RawFd) -> io::Result<()> {
        self.watched = Some(fd);
        Ok(())
    }

    fn take_woken(&mut self) -> bool {
        std::mem::take(&mut self.woken)
    }

    fn reap(&mut self, f: &mut dyn FnMut(u16, i32)) -> usize {
        let n = self.cq.len();
        for (tag, res) in self.cq.drain(..) {
            f(tag, res);
        }
        n
    }

    fn copy_in(&mut self, tag: u16, dst: &mut [u8]) -> io::Result<()> {
        let t = usize::from(tag);
        assert_eq!(
            self.state[t],
            KState::Busy,
            "copy_in of tag {tag} without a request"
        );
        let d = self.write_data[t]
            .as_ref()
            .unwrap_or_else(|| panic!("copy_in of tag {tag}, which holds no WRITE"));
        assert_eq!(d.len(), dst.len(), "copy_in of tag {tag}: wrong length");
        dst.copy_from_slice(d);
        Ok(())
    }

    fn copy_out(&mut self, tag: u16, src: &[u8]) -> io::Result<()> {
        let t = usize::from(tag);
        assert_eq!(
            self.state[t],
            KState::Busy,
            "copy_out of tag {tag} without a request"
        );
        assert_eq!(
            self.descs[t].op(),
            sys::IO_OP_READ,
            "copy_out for a non-READ"
        );
        assert!(self.read_data[t].is_none(), "copy_out of tag {tag} twice");
        self.read_data[t] = Some(src.to_vec());
        Ok(())
    }
}
