//! One queue pair of whichever wire the [`Device`] is on, for a frontend
//! that picks the wire at run time and keeps one type for its queue
//! (the fio engine): [`Queue`] forwards [`BlockQueue`] to the wire's own
//! queue pair, written once here.
//!
//! Each call matches on the wire once and then runs the wire's own code;
//! a frontend that wants no match per call runs its code generic over
//! [`BlockQueue`] through [`OnQueue`](crate::OnQueue) instead.

use std::time::Duration;

use mcqio::core::block::{BlockQueue, Interrupt, SleepOn};
use mcqio::nvme::tcp::TcpQueuePair;
use mcqio::ufs::{UfsQpairOptions, UfsQueuePair};
use mcqio::{
    Completion, IoBuf, QpairOptions, QueueCounters, QueuePair, SubmitError, SubmitErrorKind,
};

use crate::Device;

/// A queue pair of an NVMe controller, a UFS host controller or an
/// NVMe/TCP target, addressed by a `u32` unit id (an NVMe namespace id; a
/// UFS LUN, refused above 255 as an unknown LUN).
// One per thread, held in place for its life: boxing the larger variant
// would save a few hundred bytes once and cost a pointer chase per call.
#[allow(clippy::large_enum_variant)]
pub enum Queue<B: IoBuf> {
    /// NVMe over PCIe (or the fake).
    Nvme(QueuePair<B>),
    /// UFS (or the fake).
    Ufs(UfsQueuePair<B>),
    /// NVMe over TCP: the queue pair's own connection.
    Tcp(TcpQueuePair<B>),
}

impl<B: IoBuf> std::fmt::Debug for Queue<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wire = match self {
            Queue::Nvme(_) => "nvme",
            Queue::Ufs(_) => "ufs",
            Queue::Tcp(_) => "tcp",
        };
        f.debug_struct("Queue")
            .field("wire", &wire)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Create a queue pair moving `B`s on the calling thread. `opts` are
    /// NVMe's; a UFS queue pair takes their timeout, timeout policy,
    /// mapping and wait policy (its depth is the controller's), and an
    /// NVMe/TCP queue pair's depth is capped to what the target's queues
    /// hold (CAP.MQES; Linux's nvmet-tcp and the fake offer 128 entries).
    /// [`BlockQueue::depth`] says the depth granted.
    pub fn create_queue<B: IoBuf>(&self, opts: QpairOptions) -> mcqio::Result<Queue<B>> {
        Ok(match self {
            Device::Nvme(c) => Queue::Nvme(c.create_qpair_for::<B>(opts)?),
            Device::Tcp(c) => {
                let most = c.cap().max_queue_entries().saturating_sub(1).clamp(1, 4096) as u16;
                Queue::Tcp(c.create_qpair_for::<B>(QpairOptions {
                    depth: opts.depth.min(most),
                    ..opts
                })?)
            }
            Device::Ufs(c) => Queue::Ufs(c.create_qpair_for::<B>(UfsQpairOptions {
                io_timeout: opts.io_timeout,
                timeout_policy: opts.timeout_policy,
                mapping: opts.mapping,
                wait: opts.wait,
            })?),
        })
    }
}

/// `$body` with `$q` bound to the wire's queue pair of `$self`.
macro_rules! each {
    ($self:expr, $q:ident => $body:expr) => {
        match $self {
            Queue::Nvme($q) => $body,
            Queue::Ufs($q) => $body,
            Queue::Tcp($q) => $body,
        }
    };
}

/// `$body` with `$q` bound to the wire's queue pair of `$self` and `$at`
/// to the unit id as that queue pair addresses it: a UFS LUN above 255
/// names no unit, and the command is refused with `$buf` given back.
macro_rules! each_at {
    ($self:expr, $at:ident, $buf:expr, $q:ident => $body:expr) => {
        match $self {
            Queue::Nvme($q) => $body,
            Queue::Tcp($q) => $body,
            Queue::Ufs($q) => match u8::try_from($at) {
                Ok($at) => $body,
                Err(_) => Err(SubmitError {
                    kind: SubmitErrorKind::UnknownNamespace { nsid: $at },
                    buf: $buf,
                }),
            },
        }
    };
}

impl<B: IoBuf> BlockQueue for Queue<B> {
    type Addr = u32;
    type Buf = B;

    #[inline]
    fn read(
        &mut self,
        at: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        each_at!(self, at, buf, q => BlockQueue::read(q, at, lba, blocks, buf, tag))
    }

    #[inline]
    fn write(
        &mut self,
        at: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        each_at!(self, at, buf, q => BlockQueue::write(q, at, lba, blocks, buf, tag))
    }

    #[inline]
    fn flush(&mut self, at: u32, tag: u64) -> Result<(), SubmitError<()>> {
        each_at!(self, at, (), q => BlockQueue::flush(q, at, tag))
    }

    #[inline]
    fn deallocate(
        &mut self,
        at: u32,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        each_at!(self, at, (), q => BlockQueue::deallocate(q, at, lba, blocks, tag))
    }

    #[inline]
    fn submit(&mut self) -> bool {
        each!(self, q => BlockQueue::submit(q))
    }

    #[inline]
    fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, f: F) -> mcqio::Result<usize> {
        each!(self, q => BlockQueue::poll(q, max, f))
    }

    fn wait<F: FnMut(Completion<B>)>(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        f: F,
    ) -> mcqio::Result<usize> {
        each!(self, q => BlockQueue::wait(q, max, timeout, f))
    }

    fn interrupt(&self) -> Option<Interrupt> {
        each!(self, q => BlockQueue::interrupt(q))
    }

    fn arm_sleep(&mut self) -> Option<SleepOn> {
        each!(self, q => BlockQueue::arm_sleep(q))
    }

    fn slept(&mut self, woken: bool) {
        each!(self, q => BlockQueue::slept(q, woken))
    }

    fn depth(&self) -> usize {
        each!(self, q => BlockQueue::depth(q))
    }

    #[inline]
    fn outstanding(&self) -> usize {
        each!(self, q => BlockQueue::outstanding(q))
    }

    fn max_transfer(&self) -> u64 {
        each!(self, q => BlockQueue::max_transfer(q))
    }

    fn block_shift(&self, at: u32) -> Option<u32> {
        match self {
            Queue::Nvme(q) => BlockQueue::block_shift(q, at),
            Queue::Tcp(q) => BlockQueue::block_shift(q, at),
            Queue::Ufs(q) => BlockQueue::block_shift(q, u8::try_from(at).ok()?),
        }
    }

    fn counters(&self) -> QueueCounters {
        each!(self, q => BlockQueue::counters(q))
    }

    fn close<F: FnMut(Completion<B>)>(self, f: F) -> mcqio::Result<()> {
        each!(self, q => BlockQueue::close(q, f))
    }
}

#[cfg(test)]
mod tests {
    use mcqio::vfio::DmaDir;
    use mcqio::{BlockDevice, DmaBuf};

    use super::*;
    use crate::DeviceSpec;

    /// Complete the one command in flight on `q`; its buffer.
    fn one(q: &mut Queue<DmaBuf>) -> DmaBuf {
        BlockQueue::submit(q);
        let mut got = None;
        while got.is_none() {
            BlockQueue::poll(q, 1, |c| {
                c.result.unwrap();
                got = c.buf;
            })
            .unwrap();
        }
        got.unwrap()
    }

    /// One queue type on every wire: a block written through it reads back
    /// the same, through the same code.
    #[test]
    fn one_queue_type_on_every_wire() {
        let t = mcqio_fixtures::tcp::FakeTcpTarget::start(Default::default()).unwrap();
        let specs = [
            "fake,sync=1".to_string(),
            "fake-ufs,sync=1".to_string(),
            format!("tcp:{}/{}", t.addr(), t.subnqn()),
        ];
        for s in specs {
            let dev = s
                .parse::<DeviceSpec>()
                .unwrap()
                .open("test")
                .unwrap()
                .device;
            let unit = dev.units()[0];
            let mut q: Queue<DmaBuf> = dev.create_queue(QpairOptions::default()).unwrap();
            assert!(q.depth() >= 1, "{s}");
            let bs = 1usize << q.block_shift(unit.id).expect("the first unit");
            assert_eq!(bs as u32, unit.block_size, "{s}");
            let mut b = DmaBuf::alloc(dev.dma(), bs, DmaDir::Bidirectional).unwrap();
            b.fill(0x5a);
            q.write(unit.id, 3, 1, b, 1).map_err(|e| e.kind).unwrap();
            let mut b = one(&mut q);
            b.fill(0);
            q.read(unit.id, 3, 1, b, 2).map_err(|e| e.kind).unwrap();
            let b = one(&mut q);
            let mut first = [0u8; 1];
            b.read_at(0, &mut first).unwrap();
            assert_eq!(first[0], 0x5a, "{s}");
            q.flush(unit.id, 3).map_err(|e| e.kind).unwrap();
            BlockQueue::submit(&mut q);
            let mut closed = 0;
            BlockQueue::close(q, |_| closed += 1).unwrap();
            assert!(closed <= 1, "{s}: at most the flush was still in flight");
        }
    }

    /// A UFS LUN is a byte: a unit id above 255 is refused at once, with
    /// the buffer given back and nothing in flight.
    #[test]
    fn a_ufs_unit_id_above_255_is_refused_with_its_buffer() {
        let dev = "fake-ufs,sync=1"
            .parse::<DeviceSpec>()
            .unwrap()
            .open("test")
            .unwrap()
            .device;
        let mut q: Queue<DmaBuf> = dev.create_queue(QpairOptions::default()).unwrap();
        let b = DmaBuf::alloc(dev.dma(), 4096, DmaDir::Bidirectional).unwrap();
        let e = q.read(256, 0, 1, b, 7).unwrap_err();
        assert_eq!(e.kind, SubmitErrorKind::UnknownNamespace { nsid: 256 });
        assert_eq!(e.buf.len(), 4096);
        assert_eq!(
            q.flush(300, 8).unwrap_err().kind,
            SubmitErrorKind::UnknownNamespace { nsid: 300 }
        );
        assert_eq!(q.outstanding(), 0);
        assert_eq!(q.block_shift(256), None);
    }
}
