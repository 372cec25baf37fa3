//! One NVMe/TCP connection: the socket, ICReq/ICResp, the receive buffer,
//! the send queue of one vectored send, and the synchronous command
//! exchange the admin queue and every queue's Connect use.
//!
//! A connection is blocking (with a deadline per call) while it runs
//! synchronous commands — bring-up, admin commands, Keep Alive — and
//! non-blocking once it carries a queue pair's I/O, which is polled.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::digest::{DataDigest, Digests, DIGEST_BYTES};
use super::error::{TcpError, Violation};
use super::fabrics::{FabricsSqe, SglDescriptor};
use super::pdu::{self, pdu_type, Direction, Negotiated, Parse, Pdu};
use super::recv::RecvBuf;
use crate::nvme::spec::{Cqe, Sqe};

/// Room in the receive buffer beyond the largest data PDU: its header,
/// digests and padding, and a few small PDUs behind it.
pub(crate) const RX_SLACK: usize = 16 << 10;

/// What a synchronous command moves.
pub(crate) enum SyncData<'a> {
    /// Nothing.
    None,
    /// In-capsule data (a Connect's 1024 bytes).
    In(&'a [u8]),
    /// Data the target sends back (Identify, Get Log Page).
    Out(&'a mut [u8]),
}

/// A connection (see the module docs).
pub(crate) struct Conn {
    pub sock: TcpStream,
    pub rx: RecvBuf,
    pub neg: Negotiated,
    /// What one H2CData PDU may carry (ICResp).
    pub maxh2cdata: u32,
    /// R2Ts per command we accept outstanding, MAXR2T + 1.
    pub max_r2ts: u32,
}

fn left(deadline: Instant, ms: u64) -> Result<Duration, TcpError> {
    let now = Instant::now();
    if now >= deadline {
        return Err(TcpError::Timeout { ms });
    }
    // A zero timeout means "block forever" to the socket calls.
    Ok((deadline - now).max(Duration::from_millis(1)))
}

impl Conn {
    /// Connect to `addr` and negotiate: ask for `digests`, HPDA 0 and
    /// `maxr2t` (0's based); accept data PDUs of up to `max_data` bytes,
    /// with a receive buffer `rx_extra` bytes larger than one of those
    /// needs. Blocking when it returns.
    pub fn open(
        addr: SocketAddr,
        digests: Digests,
        maxr2t: u32,
        max_data: u32,
        rx_extra: usize,
        timeout: Duration,
    ) -> Result<Conn, TcpError> {
        let ms = timeout.as_millis() as u64;
        let deadline = Instant::now() + timeout;
        let sock = TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                TcpError::Timeout { ms }
            } else {
                TcpError::of_io(&e)
            }
        })?;
        sock.set_nodelay(true).map_err(|e| TcpError::of_io(&e))?;
        let mut c = Conn {
            sock,
            rx: RecvBuf::with_capacity(max_data as usize + RX_SLACK + rx_extra),
            neg: Negotiated::INITIAL,
            maxh2cdata: 0,
            max_r2ts: maxr2t.saturating_add(1),
        };
        let mut b = [0u8; pdu::IC_BYTES];
        // HPDA 0 and a PDA of at most 31: the builder cannot fail.
        let n = pdu::write_ic_req(&mut b, 0, digests, maxr2t).map_err(|_| TcpError::Closed)?;
        c.send_blocking(&b[..n], deadline, ms)?;
        let resp = c.next_pdu(deadline, ms, |p| match p {
            Pdu::IcResp(r) => Ok(r),
            Pdu::TermReq { fes, fei, .. } => Err(TcpError::Terminated { fes, fei }),
            other => Err(Violation::NoIcResp(type_of(&other)).into()),
        })??;
        c.neg = Negotiated::for_host(digests, 0, &resp, max_data)?;
        c.maxh2cdata = resp.maxh2cdata;
        Ok(c)
    }

    /// Block on every call (each bounded by its deadline), or not.
    pub fn set_blocking(&self, on: bool) -> Result<(), TcpError> {
        self.sock
            .set_nonblocking(!on)
            .map_err(|e| TcpError::of_io(&e))
    }

    /// End the connection both ways (best effort: it may be gone).
    pub fn close(&self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    /// Tell the target why we end the connection (best effort, one
    /// non-blocking attempt), then end it.
    pub fn terminate(&self, e: &TcpError) {
        if let TcpError::Pdu(p) = e {
            let (fes, fei) = p.fes();
            let mut b = [0u8; pdu::DATA_HLEN];
            if let Ok(n) = pdu::write_term_req(&mut b, pdu_type::H2C_TERM_REQ, fes, fei, &[]) {
                let _ = self.sock.set_nonblocking(true);
                let _ = (&self.sock).write(&b[..n]);
            }
        }
        self.close();
    }

    fn send_blocking(&mut self, b: &[u8], deadline: Instant, ms: u64) -> Result<(), TcpError> {
        self.sock
            .set_write_timeout(Some(left(deadline, ms)?))
            .map_err(|e| TcpError::of_io(&e))?;
        self.sock.write_all(b).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                TcpError::Timeout { ms }
            }
            _ => TcpError::of_io(&e),
        })
    }

    /// Receive until one whole PDU is buffered, hand it to `f`, consume it.
    /// A malformed PDU is answered with an H2CTermReq.
    fn next_pdu<T>(
        &mut self,
        deadline: Instant,
        ms: u64,
        f: impl FnOnce(Pdu<'_>) -> T,
    ) -> Result<T, TcpError> {
        loop {
            match self.rx.peek(Direction::ControllerToHost, &self.neg) {
                Ok(Parse::Complete { pdu, len }) => {
                    let r = f(pdu);
                    self.rx.consume(len);
                    return Ok(r);
                }
                Ok(Parse::Incomplete { .. }) => {}
                Err(e) => {
                    let e = TcpError::Pdu(e);
                    self.terminate(&e);
                    return Err(e);
                }
            }
            self.sock
                .set_read_timeout(Some(left(deadline, ms)?))
                .map_err(|e| TcpError::of_io(&e))?;
            match self.sock.read(self.rx.spare()) {
                Ok(0) => return Err(TcpError::Closed),
                Ok(n) => self.rx.commit(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(TcpError::Timeout { ms })
                }
                Err(e) => return Err(TcpError::of_io(&e)),
            }
        }
    }

    /// Run one command synchronously under `cid` and wait for its
    /// response, at most `timeout`. Data out only in-capsule; data in by
    /// C2HData, in order and inside `data`. Returns the CQE whatever its
    /// status (a C2HData with SUCCESS stands for a successful one).
    pub fn exec(
        &mut self,
        sqe: Sqe,
        cid: u16,
        data: SyncData<'_>,
        timeout: Duration,
    ) -> Result<Cqe, TcpError> {
        let deadline = Instant::now() + timeout;
        self.send_command(sqe, cid, &data, deadline, timeout.as_millis() as u64)?;
        self.await_response(cid, data, deadline, timeout.as_millis() as u64)
    }

    /// Send the capsule of `sqe` under `cid` (its SGL describing `data`),
    /// by `deadline`.
    pub fn send_command(
        &mut self,
        sqe: Sqe,
        cid: u16,
        data: &SyncData<'_>,
        deadline: Instant,
        ms: u64,
    ) -> Result<(), TcpError> {
        let (sqe, inline): (Sqe, &[u8]) = match data {
            SyncData::None => (sqe.with_sgl(SglDescriptor::transport(0)), &[]),
            SyncData::In(b) => (
                sqe.with_sgl(SglDescriptor::in_capsule(0, b.len() as u32)),
                b,
            ),
            SyncData::Out(b) => (sqe.with_sgl(SglDescriptor::transport(b.len() as u32)), &[]),
        };
        // Cold path: a buffer per command is fine here.
        let mut out = vec![0u8; 256 + inline.len()];
        let n = pdu::write_capsule_cmd(&mut out, &sqe.with_cid(cid), inline, &self.neg)
            .map_err(|_| Violation::SendQueueFull)?;
        self.send_blocking(&out[..n], deadline, ms)
    }

    /// Wait, until `deadline`, for the response to the command sent under
    /// `cid` (see [`Conn::exec`]).
    pub fn await_response(
        &mut self,
        cid: u16,
        mut data: SyncData<'_>,
        deadline: Instant,
        ms: u64,
    ) -> Result<Cqe, TcpError> {
        let mut got = 0u32;
        loop {
            let step = self.next_pdu(deadline, ms, |p| sync_step(p, cid, &mut data, &mut got))?;
            match step {
                Ok(Some(cqe)) => return Ok(cqe),
                Ok(None) => {}
                Err(e) => {
                    self.close();
                    return Err(e);
                }
            }
        }
    }

    /// The response to the command without data sent under `cid`, if it
    /// has arrived: what is buffered, then at most one receive that does
    /// not wait. `Ok(None)`: not yet.
    pub fn poll_response(&mut self, cid: u16) -> Result<Option<Cqe>, TcpError> {
        let mut received = false;
        let mut got = 0u32;
        loop {
            match self.rx.peek(Direction::ControllerToHost, &self.neg) {
                Ok(Parse::Complete { pdu, len }) => {
                    let step = sync_step(pdu, cid, &mut SyncData::None, &mut got);
                    self.rx.consume(len);
                    match step {
                        Ok(Some(cqe)) => return Ok(Some(cqe)),
                        Ok(None) => continue,
                        Err(e) => {
                            self.close();
                            return Err(e);
                        }
                    }
                }
                Ok(Parse::Incomplete { .. }) => {}
                Err(e) => {
                    let e = TcpError::Pdu(e);
                    self.terminate(&e);
                    return Err(e);
                }
            }
            if received {
                return Ok(None);
            }
            let spare = self.rx.spare();
            // SAFETY: `spare` is writable for `spare.len()` bytes and lives
            // across the call; MSG_DONTWAIT: the call never waits, whatever
            // the socket's blocking mode.
            let n = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
                    _ => Err(TcpError::of_io(&e)),
                };
            }
            if n == 0 {
                return Err(TcpError::Closed);
            }
            self.rx.commit(n as usize);
            received = true;
        }
    }
}

/// One PDU of a synchronous command's answer: `Some` with the CQE once it
/// ended (a C2HData with SUCCESS stands for a successful one), data placed
/// in `data` in order (`got` bytes so far).
fn sync_step(
    p: Pdu<'_>,
    cid: u16,
    data: &mut SyncData<'_>,
    got: &mut u32,
) -> Result<Option<Cqe>, TcpError> {
    match p {
        Pdu::CapsuleResp { cqe } => {
            if cqe.cid != cid {
                return Err(Violation::UnknownCid(cqe.cid).into());
            }
            if let SyncData::Out(b) = data {
                if cqe.nvme_status().is_success() && *got as usize != b.len() {
                    return Err(Violation::ShortRead {
                        cid,
                        got: *got,
                        len: b.len() as u32,
                    }
                    .into());
                }
            }
            Ok(Some(cqe))
        }
        Pdu::Data {
            cccid,
            datao,
            success,
            data: d,
            ..
        } => {
            if cccid != cid {
                return Err(Violation::UnknownCid(cccid).into());
            }
            let SyncData::Out(b) = data else {
                return Err(Violation::DataForNonRead(cid).into());
            };
            let len = b.len() as u32;
            if datao != *got {
                return Err(Violation::DataOutOfOrder {
                    cid,
                    datao,
                    expected: *got,
                }
                .into());
            }
            let end = datao as usize + d.len();
            if end > b.len() {
                return Err(Violation::DataOutOfRange {
                    cid,
                    datao,
                    datal: d.len() as u32,
                    len,
                }
                .into());
            }
            b[datao as usize..end].copy_from_slice(d);
            *got = end as u32;
            if success {
                if *got != len {
                    return Err(Violation::ShortRead {
                        cid,
                        got: *got,
                        len,
                    }
                    .into());
                }
                return Ok(Some(Cqe {
                    cid,
                    ..Default::default()
                }));
            }
            Ok(None)
        }
        Pdu::R2t { cccid, .. } => Err(Violation::R2tForNonWrite(cccid).into()),
        Pdu::TermReq { fes, fei, .. } => Err(TcpError::Terminated { fes, fei }),
        other => Err(Violation::UnexpectedPdu(type_of(&other)).into()),
    }
}

/// The type code of a parsed PDU.
pub(crate) fn type_of(p: &Pdu<'_>) -> u8 {
    match p {
        Pdu::IcReq(_) => pdu_type::IC_REQ,
        Pdu::IcResp(_) => pdu_type::IC_RESP,
        Pdu::TermReq { pdu_type, .. } | Pdu::Data { pdu_type, .. } => *pdu_type,
        Pdu::CapsuleCmd { .. } => pdu_type::CAPSULE_CMD,
        Pdu::CapsuleResp { .. } => pdu_type::CAPSULE_RESP,
        Pdu::R2t { .. } => pdu_type::R2T,
    }
}

/// The most iovecs one send takes (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;

/// What one vectored send carries: PDU headers and digests in a fixed
/// arena, data straight from the commands' buffers. Append-only until
/// everything queued has been sent, then reused from the start; never
/// reallocated, so the addresses it holds stay valid.
pub(crate) struct TxQueue {
    arena: Box<[u8]>,
    used: usize,
    iov: Vec<libc::iovec>,
    /// First iovec not (wholly) sent.
    head: usize,
    /// Bytes ever queued.
    pub queued: u64,
    /// Bytes ever handed to the socket.
    pub sent: u64,
    /// Send calls made.
    pub sends: u64,
}

/// A position in a [`TxQueue`] ([`TxQueue::mark`]).
#[derive(Copy, Clone, Debug)]
pub(crate) struct TxMark {
    iovs: usize,
    used: usize,
    queued: u64,
}

// SAFETY: the iovecs point into `arena` (owned) or into the buffers of
// commands in flight, which the queue pair owning this queue holds (and
// moves with it); nothing here is shared with another thread.
unsafe impl Send for TxQueue {}

impl TxQueue {
    /// A queue with `arena` bytes for headers and room for `iovs` pieces.
    pub fn new(arena: usize, iovs: usize) -> Self {
        TxQueue {
            arena: vec![0u8; arena].into_boxed_slice(),
            used: 0,
            iov: Vec::with_capacity(iovs),
            head: 0,
            queued: 0,
            sent: 0,
            sends: 0,
        }
    }

    /// Whether `bytes` of headers in `pieces` more pieces fit.
    pub fn room(&self, bytes: usize, pieces: usize) -> bool {
        self.used + bytes <= self.arena.len() && self.iov.len() + pieces <= self.iov.capacity()
    }

    /// Whether everything queued was sent.
    pub fn is_empty(&self) -> bool {
        self.head == self.iov.len()
    }

    /// The most pieces the queue holds (an empty queue).
    pub fn piece_capacity(&self) -> usize {
        self.iov.capacity()
    }

    /// Bytes queued and not yet handed to the socket.
    #[inline]
    pub fn unsent(&self) -> u64 {
        self.queued - self.sent
    }

    /// Where the queue ends now, for [`TxQueue::roll_back`].
    pub fn mark(&self) -> TxMark {
        TxMark {
            iovs: self.iov.len(),
            used: self.used,
            queued: self.queued,
        }
    }

    /// Forget what was queued since `m`, if none of it was sent (`false`
    /// otherwise, and nothing changes): no iovec is left pointing at a
    /// buffer the caller is about to hand back.
    #[cold]
    pub fn roll_back(&mut self, m: TxMark) -> bool {
        if self.sent > m.queued || self.iov.len() < m.iovs || self.head > m.iovs {
            return false;
        }
        self.iov.truncate(m.iovs);
        self.used = m.used;
        self.queued = m.queued;
        true
    }

    fn push(&mut self, base: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        debug_assert!(self.iov.len() < self.iov.capacity());
        self.iov.push(libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: len,
        });
        self.queued += len as u64;
    }

    /// Queue header bytes written by `write` into the arena (it returns
    /// how many; the caller checked [`TxQueue::room`]).
    pub fn header<E>(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<(), E> {
        let n = write(&mut self.arena[self.used..])?;
        let at = self.used;
        self.used += n;
        let p = self.arena[at..].as_ptr();
        self.push(p, n);
        Ok(())
    }

    /// Queue `len` bytes at `base` from a command's buffer.
    ///
    /// # Safety
    ///
    /// `base..base + len` stays valid for reads until everything queued
    /// now has been sent or the queue is cleared.
    pub unsafe fn data(&mut self, base: *const u8, len: usize) {
        self.push(base, len);
    }

    /// Queue a data digest.
    pub fn digest(&mut self, d: &DataDigest) {
        let _ = self.header(|b: &mut [u8]| -> Result<usize, ()> {
            b[..DIGEST_BYTES].copy_from_slice(&d.value().to_le_bytes());
            Ok(DIGEST_BYTES)
        });
    }

    /// One vectored send of what is queued (at most [`IOV_MAX`] pieces).
    /// `Ok(true)`: something went out.
    pub fn flush(&mut self, sock: &TcpStream) -> Result<bool, TcpError> {
        if self.is_empty() {
            return Ok(false);
        }
        let cnt = (self.iov.len() - self.head).min(IOV_MAX);
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = self.iov[self.head..].as_mut_ptr();
        msg.msg_iovlen = cnt as _;
        self.sends += 1;
        // SAFETY: `msg` names `cnt` iovecs of ours, each pointing at bytes
        // that stay valid until sent (arena, or buffers held in flight:
        // `TxQueue::data`'s contract); the kernel only reads them.
        // MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(false),
                _ => Err(TcpError::of_io(&e)),
            };
        }
        let mut n = n as usize;
        self.sent += n as u64;
        while n > 0 && self.head < self.iov.len() {
            let v = &mut self.iov[self.head];
            if v.iov_len <= n {
                n -= v.iov_len;
                self.head += 1;
            } else {
                // SAFETY: `n < iov_len`: the advanced base stays inside
                // the piece.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n).cast() };
                v.iov_len -= n;
                n = 0;
            }
        }
        if self.is_empty() {
            self.iov.clear();
            self.head = 0;
            self.used = 0;
        }
        Ok(true)
    }

    /// Forget everything queued (the connection is gone: nothing will read
    /// the buffers any more).
    pub fn clear(&mut self) {
        self.iov.clear();
        self.head = 0;
        self.used = 0;
        self.sent = self.queued;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A send queue larger than the socket takes at once goes out over
    /// many partial sends, each resuming inside the piece where the last
    /// stopped, and the peer receives every byte once, in order.
    ///
    /// The first flush is made before the peer reads anything, with the
    /// sender's buffer set small: it can then take only that buffer and
    /// the peer's initial window, far below the 6 MiB queued, whatever the
    /// host's TCP autotuning limits (with the reader running from the
    /// start and `tcp_rmem`'s maximum at 32 MiB, loopback took the whole
    /// queue in one send in 22 runs of 30).
    #[test]
    fn partial_sends_resume_where_they_stopped() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx_sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx_sock, _) = l.accept().unwrap();
        tx_sock.set_nonblocking(true).unwrap();
        let small: libc::c_int = 64 << 10;
        // SAFETY: a valid socket descriptor, and `small` is a c_int that
        // lives across the call, its size passed with it.
        let r = unsafe {
            libc::setsockopt(
                tx_sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        // 3 headers from the arena and 3 large pieces of "buffer".
        let data: Vec<u8> = (0..(6usize << 20))
            .map(|i| (i * 7 + (i >> 13)) as u8)
            .collect();
        let mut q = TxQueue::new(64, 16);
        let mut expect = Vec::new();
        for (k, chunk) in data.chunks(2 << 20).enumerate() {
            q.header(|b: &mut [u8]| -> Result<usize, ()> {
                b[..8].fill(k as u8);
                Ok(8)
            })
            .unwrap();
            expect.extend_from_slice(&[k as u8; 8]);
            // SAFETY: `data` outlives every flush below.
            unsafe { q.data(chunk.as_ptr(), chunk.len()) };
            expect.extend_from_slice(chunk);
        }
        let want = expect.len();
        q.flush(&tx_sock).unwrap();
        assert!(
            !q.is_empty(),
            "the socket took it all at once: no partial send tested"
        );
        let reader = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(want);
            let mut b = vec![0u8; 64 << 10];
            while got.len() < want {
                let n = rx_sock.read(&mut b).unwrap();
                assert!(n > 0);
                got.extend_from_slice(&b[..n]);
            }
            got
        });
        while !q.is_empty() {
            q.flush(&tx_sock).unwrap();
            std::thread::yield_now();
        }
        assert_eq!(q.sent, want as u64);
        assert_eq!(q.queued, want as u64);
        assert!(
            reader.join().unwrap() == expect,
            "bytes lost, repeated or reordered"
        );
        // Drained: the arena is reused from the start.
        assert!(q.room(64, 16));
    }
}
