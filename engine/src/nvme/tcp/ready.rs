//! A queue pair's "interrupt" on a socket: [`ReadySet`], an epoll set
//! holding the queue's connection, level-triggered.
//!
//! A waiting NVMe/TCP queue pair sleeps until its socket is readable (an
//! answer arrived, or the connection ended), or — while sends are held up
//! because the socket's buffer was full — writable. The core sleeps on a
//! descriptor readable when the queue has something to look at
//! ([`crate::core::qpair::Interrupt::Ready`]); the epoll set is that
//! descriptor: it is readable while one of the events it watches is
//! pending on the socket. Three reasons for a set rather than the socket
//! itself:
//!
//! - **one descriptor for the queue's life.** A reset reconnects the
//!   queue on a new socket; a reactor that registered a duplicate of the
//!   old one (`AsyncQueue::tokio`), or an io_uring poll queued on it (the
//!   ublk server), would watch a dead socket, readable for ever. They
//!   watch the set, and the queue moves the set onto the new socket.
//! - **the direction stays the queue's business**: callers watch `POLLIN`
//!   on every wire; the queue adds `EPOLLOUT` to the set only while it has
//!   sends held up, and takes it away when they left.
//! - **nothing to clear**: the set is level-triggered like the socket in
//!   it, so a sleep that starts after data arrived returns at once.
//!
//! Every arrival on the socket wakes the set's watchers (poll(2), another
//! epoll such as tokio's, io_uring), whether or not the socket was already
//! on the set's ready list, so an edge-triggered outer reactor sees each
//! arrival too.
//!
//! Costs: one `epoll_ctl` when the queue connects (and reconnects), and
//! one each time held-up sends start or stop needing the socket's room
//! (only when the send buffer fills). A polled queue ([`crate::WaitPolicy::Poll`])
//! has no set.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// The queue's epoll set (see the module docs).
#[derive(Debug)]
pub(crate) struct ReadySet {
    ep: Arc<OwnedFd>,
    /// The socket in the set, if any.
    sock: Option<RawFd>,
    /// Whether the set also watches the socket for room to send.
    writable: bool,
}

impl ReadySet {
    /// An empty set (close-on-exec).
    pub fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1 takes no pointer; it returns a new
        // descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let ep = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ReadySet {
            ep: Arc::new(ep),
            sock: None,
            writable: false,
        })
    }

    /// The set's descriptor, for the queue's waiter.
    pub fn fd(&self) -> Arc<OwnedFd> {
        Arc::clone(&self.ep)
    }

    /// `epoll_ctl(op)` of `sock` with `events`.
    fn ctl(&self, op: libc::c_int, sock: RawFd, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: sock as u64,
        };
        // SAFETY: `ev` is a valid epoll_event that lives across the call
        // (the kernel reads it; for EPOLL_CTL_DEL it is ignored); the set's
        // descriptor is open while `self` lives.
        let r = unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), op, sock, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn events(writable: bool) -> u32 {
        let mut e = libc::EPOLLIN as u32;
        if writable {
            e |= libc::EPOLLOUT as u32;
        }
        e
    }

    /// Watch `sock` (a new connection) for data, in place of any socket
    /// watched before.
    pub fn watch(&mut self, sock: RawFd) -> io::Result<()> {
        self.unwatch();
        self.ctl(libc::EPOLL_CTL_ADD, sock, Self::events(false))?;
        self.sock = Some(sock);
        self.writable = false;
        Ok(())
    }

    /// Stop watching the socket (it is about to be closed, or the
    /// connection ended): the set is never ready until the next
    /// [`watch`](Self::watch).
    pub fn unwatch(&mut self) {
        if let Some(s) = self.sock.take() {
            // Fails only if the socket is already gone from the set.
            let _ = self.ctl(libc::EPOLL_CTL_DEL, s, 0);
        }
        self.writable = false;
    }

    /// Also watch the socket for room to send (`on`), or stop. A system
    /// call only when this changes what the set watches.
    #[cold]
    pub fn want_writable(&mut self, on: bool) {
        let Some(s) = self.sock else {
            return;
        };
        if self.writable == on {
            return;
        }
        match self.ctl(libc::EPOLL_CTL_MOD, s, Self::events(on)) {
            Ok(()) => self.writable = on,
            Err(e) => log::warn!("nvme-tcp: epoll_ctl(MOD) on the queue's socket: {e}"),
        }
    }

    /// Whether the set watches for room to send.
    #[cfg(test)]
    pub fn writable(&self) -> bool {
        self.writable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::qpair::Interrupt;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    const SHORT: Option<Duration> = Some(Duration::from_millis(20));

    /// Readable while data waits (level-triggered, nothing cleared by
    /// looking), not once it was read; moved to a new socket, it follows.
    #[test]
    fn readable_while_data_waits_and_follows_a_new_socket() {
        let mut set = ReadySet::new().unwrap();
        let irq = Interrupt::Ready(set.fd());
        assert!(!irq.wait(SHORT).unwrap(), "empty set");
        let (mut a, mut b) = pair();
        set.watch(a.as_raw_fd()).unwrap();
        assert!(!irq.wait(SHORT).unwrap(), "nothing sent");
        b.write_all(b"x").unwrap();
        assert!(irq.wait(Some(Duration::from_secs(10))).unwrap());
        assert!(irq.wait(SHORT).unwrap(), "still readable: level-triggered");
        let mut one = [0u8; 1];
        a.read_exact(&mut one).unwrap();
        assert!(!irq.wait(SHORT).unwrap(), "read: no longer readable");
        // A reconnect: the old socket leaves the set before it is closed.
        let (c, mut d) = pair();
        set.watch(c.as_raw_fd()).unwrap();
        b.write_all(b"y").unwrap();
        assert!(!irq.wait(SHORT).unwrap(), "the old socket is not watched");
        d.write_all(b"z").unwrap();
        assert!(irq.wait(Some(Duration::from_secs(10))).unwrap());
        // The peer closing is readable (end of stream) too.
        set.watch(a.as_raw_fd()).unwrap();
        a.read_exact(&mut one).unwrap();
        assert!(!irq.wait(SHORT).unwrap());
        drop(b);
        assert!(irq.wait(Some(Duration::from_secs(10))).unwrap());
        set.unwatch();
        assert!(!irq.wait(SHORT).unwrap(), "unwatched: never ready");
    }

    /// Room to send is watched only when asked for.
    #[test]
    fn writable_only_while_asked() {
        let mut set = ReadySet::new().unwrap();
        let irq = Interrupt::Ready(set.fd());
        let (a, _b) = pair();
        set.watch(a.as_raw_fd()).unwrap();
        assert!(!irq.wait(SHORT).unwrap(), "an idle socket is not ready");
        set.want_writable(true);
        assert!(set.writable());
        assert!(irq.wait(SHORT).unwrap(), "an empty send buffer has room");
        set.want_writable(false);
        assert!(!irq.wait(SHORT).unwrap());
    }
}
