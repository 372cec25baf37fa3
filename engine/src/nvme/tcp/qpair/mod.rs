//! [`TcpQueuePair`]: one NVMe/TCP I/O queue on its own connection, owned by
//! one thread, on the shared queue-pair engine (`core::qpair`).
//!
//! The wire's part of the lifecycle:
//!
//! - **submit** builds each command's CapsuleCmd header in a fixed arena
//!   and queues it with its in-capsule data (a write up to IOCCSZ) straight
//!   from the command's buffer; `ring` hands everything queued since the
//!   last ring to the socket in **one vectored send** (`sendmsg`).
//! - **reap** makes at most **one receive** into the connection's buffer
//!   and parses the PDUs in place: C2HData is copied straight into the
//!   command's buffer ([`IoBuf::segment_host`]); an R2T goes to the
//!   connection's R2T queue (`tcp::r2t`, sized once by slots × (MAXR2T +
//!   1)) and is answered, oldest R2T first, with H2CData PDUs of at most
//!   MAXH2CDATA bytes (their data again straight from the buffer) as the
//!   send queue has room — at the end of the pass and on every later
//!   send, for as long as the socket takes them — so no R2T the spec
//!   allows, however large, ever waits on more room than an empty send
//!   queue has; a CapsuleResp, or a
//!   C2HData with SUCCESS, ends the command through the engine, which
//!   proves its CID (slot and generation) and completes it exactly once.
//! - Every PDU is checked before a byte moves: its CID must name a command
//!   in flight of the right kind, data must arrive in order and inside the
//!   transfer, R2Ts in order, inside the transfer and no more outstanding
//!   than MAXR2T + 1 (an R2T counts until its own data was all handed to
//!   the socket: the target may send the next once it received it), and a
//!   command completes only after its data left (none of it still owed).
//!   Any violation, a malformed PDU, a TermReq or a closed socket **ends
//!   the connection** with a typed [`TcpError`]: every command in flight
//!   ends once with [`IoError::ConnectionLost`](crate::core::io::IoError::ConnectionLost) (buffers back: a socket
//!   reaches no memory once we stop calling it) and `poll` reports the
//!   error as [`Error::Transport`](crate::core::error::Error::Transport).
//! - The send queue (`TxQueue`) holds PDU headers in an arena reused from
//!   its start once everything queued has left: every addition needs room
//!   and sends only take away, so whenever it is full nothing more is
//!   added until the socket took it all and it starts again; H2CData
//!   stays at most `SEND_AHEAD` bytes ahead of the socket, the rest owed
//!   in the R2T queue, so submissions keep their room under sustained R2T
//!   writes. A split is queued all or nothing (a child that does not fit
//!   takes the others back out of the send queue, unsent, and the request
//!   is refused with its buffer).
//! - Closing a queue pair lets its commands finish, then shuts its socket
//!   down, as Linux's initiator stops an I/O queue (no Disconnect: Linux's
//!   nvmet-tcp does not implement it on an I/O queue and logs each as a
//!   failed command).
//! - Timeouts (`QpairOptions::io_timeout`) send Abort on the admin queue
//!   (`TimeoutPolicy::Abort`); what that does not settle resets the
//!   controller — a reconnect of the association
//!   ([`TcpController::reset`]) — after which every queue pair ends its
//!   commands once with [`IoError::AbortedByReset`](crate::core::io::IoError::AbortedByReset) and Connects its queue
//!   again. A reset also brings back a queue pair whose own connection
//!   ended.
//!
//! What a socket cannot promise that a PCIe queue can: every submit batch
//! costs a `sendmsg` and seeing answers a `recv` (a PCIe queue needs one
//! doorbell store and no system call). The queue pair does not receive on
//! every poll: its receive pacer (`tcp::pace`) holds receives after one
//! that brought data, for a number of polls learnt so that a receive
//! brings about three quarters of what is in flight (no hold at depth 1,
//! at most `HOLD_MAX` polls; [`crate::nvme::tcp::TcpOptions::recv_pacing`] switches
//! it off), and backs off after receives that found nothing. The price is
//! that an answer may wait in the socket for up to that hold. And data is
//! copied twice each way (the kernel's copy into or out of the socket,
//! ours between the receive buffer and the command's buffer) where a PCIe
//! device moves it once by DMA. A target that stops answering is only
//! noticed by a timeout.
//!
//! **Waiting** ([`crate::WaitPolicy::Interrupt`], `Hybrid`): a socket has
//! no interrupt to enable; its readiness is the interrupt. A waiting queue
//! pair keeps an epoll set holding its connection (`tcp::ready`), which the
//! core's `wait`, `BlockQueue::arm_sleep` callers and `AsyncQueue::tokio`
//! watch like any queue's eventfd: readable when an answer arrived or the
//! connection ended, or — only while sends are held up by a full socket
//! buffer — when the socket has room. Arming clears the receive pacer's
//! hold, so the poll before the sleep (and the first one after it)
//! receives: a queue never sleeps on an answer its pacer held back in the
//! socket, and its own receive buffer then holds at most the front of a
//! PDU whose rest wakes it. What that costs a socket, beyond a PCIe
//! queue's eventfd: each sleep is a `poll(2)` of the set besides the
//! `recv` that finds nothing before it, and each wake-up a `recv` more;
//! at depth 1 an I/O that sleeps costs about a `sendmsg`, three `recv`s
//! and a `poll` (a polled one: a `sendmsg` and its `recv`s). The Keep
//! Alive and the command timeouts run from the sleep's slices (10 ms).

mod blocking;
mod create;
mod data;
mod reap;
mod send;
mod submit;
mod teardown;
#[cfg(test)]
mod tests;
mod timeouts;
mod wire;

use std::sync::Arc;

use crate::core::io::{DmaBuf, IoBuf};
use crate::core::qpair::{Engine, QueueCounters};
use crate::nvme::tcp::conn::{Conn, TxQueue};
use crate::nvme::tcp::controller::TcpController;
use crate::nvme::tcp::error::TcpError;
use crate::nvme::tcp::pace::RecvPacer;
use crate::nvme::tcp::r2t::R2tQueue;
use crate::nvme::tcp::ready::ReadySet;

/// Polls between looks at the Keep Alive clock.
const KEEP_ALIVE_POLLS: u32 = 256;
/// Empty polls (with commands outstanding) between health looks.
const HEALTH_CHECK_INTERVAL: u32 = 4096;
/// Arena bytes one PDU header may take: 72-byte CapsuleCmd header, its
/// digest, padding to a CPDA of up to 128 bytes, a data digest.
const HEADER_ROOM: usize = 136;
/// Arena bytes for H2CData headers beyond one capsule per slot.
const H2C_ARENA: usize = 64 << 10;
/// Receive-buffer bytes per queue entry beyond the largest data PDU, so
/// one `recv` can take the answers to a whole batch of small reads (a 4 KiB
/// read's C2HData and CapsuleResp with digests and padding).
const RX_PER_ENTRY: usize = 4096 + 128;
/// Entries the receive buffer is sized for at most.
const RX_ENTRIES_MAX: usize = 256;
/// Bytes of H2CData queued ahead of the socket at most: owed R2T data
/// beyond it waits in the R2T queue (`tcp::r2t`), which keeps the send
/// queue's arena for submissions and lets it drain and restart often.
const SEND_AHEAD: u64 = 1 << 20;
/// Queue-and-send rounds one pass makes for owed R2T data.
const OWED_ROUNDS: usize = 16;
/// R2Ts per command the R2T queue is sized for at most (a larger MAXR2T
/// still works; the queue then grows the first time it is needed).
const R2TS_SIZED: u32 = 16;

/// What a command in a slot moves.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
enum Kind {
    /// No data (Flush), or data in the arena (Dataset Management).
    #[default]
    NoData,
    /// Data comes back by C2HData.
    Read,
    /// Data went in the capsule.
    WriteInCapsule,
    /// Data goes out by R2T and H2CData.
    WriteR2t,
}

/// The wire's record of the command in a tracker slot.
#[derive(Copy, Clone, Debug, Default)]
struct Cmd {
    kind: Kind,
    /// Bytes of the transfer.
    len: u32,
    /// Where the transfer starts in the buffer (a split child's offset in
    /// its parent's buffer).
    base: u64,
    /// Its CID (slot and generation).
    cid: u16,
    /// Read: bytes received; R2T write: bytes asked for by R2Ts so far.
    got: u32,
    /// Its R2Ts in the R2T queue: data not all sent yet.
    r2t_open: u32,
    /// The send queue position after all this command's queued data.
    data_done_at: u64,
}

#[derive(Copy, Clone, Debug)]
struct NsGeom {
    id: u32,
    nsze: u64,
    shift: u32,
    usable: bool,
}

/// Counters of one NVMe/TCP queue pair.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpQpairStats {
    /// The counters every queue pair keeps.
    pub counters: QueueCounters,
    /// `sendmsg` calls.
    pub sends: u64,
    /// `recv` calls.
    pub recvs: u64,
    /// `recv` calls that found nothing (EAGAIN).
    pub empty_recvs: u64,
    /// PDUs received and parsed.
    pub pdus: u64,
    /// C2HData PDUs received.
    pub c2h_data: u64,
    /// R2Ts answered.
    pub r2ts: u64,
    /// H2CData PDUs sent.
    pub h2c_data: u64,
    /// Times H2CData owed for R2Ts waited for room in the send queue (or
    /// for the socket to take what was queued ahead of it).
    pub r2t_waits: u64,
    /// Writes whose data went in the capsule.
    pub in_capsule_writes: u64,
}

/// One NVMe/TCP I/O queue pair (see the module docs). `Send`, not `Sync`:
/// one per thread. Its I/O API is [`crate::core::block::BlockQueue`] (and
/// the blocking helpers `read_blocking`, `write_blocking`, `flush_blocking`), as on every
/// wire.
pub struct TcpQueuePair<B: IoBuf = DmaBuf> {
    eng: Engine<B, ()>,
    ctrl: Arc<TcpController>,
    qid: u16,
    /// Queue entries asked for in Connect (depth + 1).
    entries: u16,
    conn: Conn,
    tx: TxQueue,
    /// H2CData owed for R2Ts, not all sent yet.
    r2ts: R2tQueue,
    cmds: Box<[Cmd]>,
    in_capsule: usize,
    ns: Vec<NsGeom>,
    /// Why the connection ended, once it did.
    failed: Option<TcpError>,
    polls: u32,
    /// Which polls receive (`tcp::pace`).
    pacer: RecvPacer,
    /// What a waiting queue sleeps on (`tcp::ready`); `None`: polled only
    /// ([`crate::WaitPolicy::Poll`]).
    ready: Option<ReadySet>,
    stats: TcpQpairStats,
    /// The qid went back to the controller.
    released: bool,
    /// Tests: the split child (by its first LBA) that fails to queue.
    #[cfg(test)]
    fail_child: Option<u64>,
}

impl<B: IoBuf> std::fmt::Debug for TcpQueuePair<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpQueuePair")
            .field("qid", &self.qid)
            .field("depth", &self.eng.depth())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl<B: IoBuf> TcpQueuePair<B> {
    /// The queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The controller.
    pub fn controller(&self) -> &Arc<TcpController> {
        &self.ctrl
    }

    /// The counters.
    pub fn stats(&self) -> TcpQpairStats {
        TcpQpairStats {
            counters: self.eng.counters(),
            sends: self.tx.sends,
            ..self.stats
        }
    }

    /// The counters every queue pair keeps.
    pub fn counters(&self) -> QueueCounters {
        self.eng.counters()
    }

    /// Why the connection ended, if it did.
    pub fn connection_error(&self) -> Option<TcpError> {
        self.failed
    }

    fn geom(&self, nsid: u32) -> Option<NsGeom> {
        self.ns.iter().find(|n| n.id == nsid).copied()
    }
}
