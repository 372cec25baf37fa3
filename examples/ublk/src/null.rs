//! [`NullTarget`]: a diagnostic target that answers every request at
//! once, without the engine or any device — `mcqio-ublk add <device>
//! --null copy|nocopy`. It stores nothing (a READ returns whatever the
//! tag's buffer holds), so it is for measuring, never for data.
//!
//! It splits a request's cost on the real path into parts that can each
//! be measured with the same fio job:
//!
//! | served by | what a request costs |
//! |---|---|
//! | `--null nocopy --user-copy` | the kernel's ublk and io_uring round trip and the server's bookkeeping; no data moves (the server skips the `pread`/`pwrite` USER_COPY would need) |
//! | `--null copy` | the same, plus the kernel's copy of the data into or out of the tag buffer (copy mode, as every VFIO device is served) |
//! | `fake:null` | the same, plus the engine: a submission and completion through an NVMe queue pair to the in-process fake, which moves no data |
//! | `vfio:<BDF>` | the same, plus a real (or emulated) device |
//!
//! The server's state machine, request mapping and tag buffers are the
//! same for all four; only the [`Target`] behind them changes.

use std::collections::VecDeque;

use mcqio::core::block::BlockQueue;
use mcqio::{Completion, DmaBuf, SubmitError, SubmitErrorKind};

use crate::target::Target;

/// What `--null` leaves in: the data copy or nothing.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NullMode {
    /// Copy mode: the kernel copies each request's data into (WRITE) or
    /// out of (READ) the tag buffer, as on the real path.
    Copy,
    /// USER_COPY mode with the server's copies skipped: no data moves.
    NoCopy,
}

impl std::str::FromStr for NullMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "copy" => Ok(NullMode::Copy),
            "nocopy" => Ok(NullMode::NoCopy),
            _ => Err(format!("--null {s:?}: expected copy or nocopy")),
        }
    }
}

/// A queue that completes every command at the next poll, in order.
pub struct NullTarget {
    block_shift: u32,
    depth: usize,
    done: VecDeque<Completion<DmaBuf>>,
}

impl NullTarget {
    /// A target with blocks of `1 << block_shift` bytes taking up to
    /// `depth` commands at once (all its room is allocated now).
    pub fn new(block_shift: u32, depth: usize) -> Self {
        NullTarget {
            block_shift,
            depth,
            done: VecDeque::with_capacity(depth),
        }
    }

    /// Queue the completion of `tag`; `false` when the queue is full.
    fn take(&mut self, tag: u64, buf: Option<DmaBuf>) -> bool {
        if self.done.len() >= self.depth {
            return false;
        }
        self.done.push_back(Completion {
            tag,
            result: Ok(()),
            buf,
            dw0: 0,
        });
        true
    }

    fn data(&mut self, buf: DmaBuf, tag: u64) -> Result<(), SubmitError<DmaBuf>> {
        if self.done.len() >= self.depth {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        }
        self.take(tag, Some(buf));
        Ok(())
    }

    fn no_data(&mut self, tag: u64) -> Result<(), SubmitError<()>> {
        if self.take(tag, None) {
            Ok(())
        } else {
            Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf: (),
            })
        }
    }
}

impl BlockQueue for NullTarget {
    type Addr = u32;
    type Buf = DmaBuf;

    fn read(
        &mut self,
        _at: u32,
        _lba: u64,
        _blocks: u32,
        buf: DmaBuf,
        tag: u64,
    ) -> Result<(), SubmitError<DmaBuf>> {
        self.data(buf, tag)
    }

    fn write(
        &mut self,
        at: u32,
        lba: u64,
        blocks: u32,
        buf: DmaBuf,
        tag: u64,
    ) -> Result<(), SubmitError<DmaBuf>> {
        let _ = (at, lba, blocks);
        self.data(buf, tag)
    }

    fn flush(&mut self, _at: u32, tag: u64) -> Result<(), SubmitError<()>> {
        self.no_data(tag)
    }

    fn deallocate(
        &mut self,
        _at: u32,
        _lba: u64,
        _blocks: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        self.no_data(tag)
    }

    fn submit(&mut self) -> bool {
        false
    }

    fn poll<F: FnMut(Completion<DmaBuf>)>(&mut self, max: usize, mut f: F) -> mcqio::Result<usize> {
        let n = max.min(self.done.len());
        for c in self.done.drain(..n) {
            f(c);
        }
        Ok(n)
    }

    fn depth(&self) -> usize {
        self.depth
    }

    fn outstanding(&self) -> usize {
        self.done.len()
    }

    fn max_transfer(&self) -> u64 {
        u64::from(u32::MAX)
    }

    fn block_shift(&self, _at: u32) -> Option<u32> {
        Some(self.block_shift)
    }

    fn close<F: FnMut(Completion<DmaBuf>)>(mut self, f: F) -> mcqio::Result<()> {
        self.done.drain(..).for_each(f);
        Ok(())
    }
}

impl Target for NullTarget {
    fn write_fua(
        &mut self,
        at: u32,
        lba: u64,
        blocks: u32,
        buf: DmaBuf,
        tag: u64,
    ) -> Result<(), SubmitError<DmaBuf>> {
        let _ = (at, lba, blocks);
        self.data(buf, tag)
    }

    fn write_zeroes(
        &mut self,
        _at: u32,
        _lba: u64,
        _blocks: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        self.no_data(tag)
    }
}
