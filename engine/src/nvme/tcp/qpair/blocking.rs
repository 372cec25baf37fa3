//! The blocking convenience API (the shared
//! [`BlockQueue`](crate::core::block::BlockQueue) view, `Addressed`, is
//! in `submit.rs`: for NVMe/TCP it is the submission API).

use super::TcpQueuePair;
use crate::core::error::Result;
use crate::core::io::DmaBuf;

/// The blocking convenience API (as on the PCIe queue pair): one bounce
/// buffer kept by the queue pair, requests above the per-command limit
/// split. Each needs an idle queue pair ([`Error::QueueBusy`](crate::core::error::Error::QueueBusy) otherwise).
impl TcpQueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (a multiple of the block size) from `slba`.
    pub fn read_blocking(&mut self, nsid: u32, slba: u64, dst: &mut [u8]) -> Result<()> {
        crate::core::block::read_blocking(self, nsid, slba, dst)
    }

    /// Write `src` (a multiple of the block size) at `slba`.
    pub fn write_blocking(&mut self, nsid: u32, slba: u64, src: &[u8]) -> Result<()> {
        crate::core::block::write_blocking(self, nsid, slba, src)
    }

    /// Flush namespace `nsid` and wait.
    pub fn flush_blocking(&mut self, nsid: u32) -> Result<()> {
        crate::core::block::flush_blocking(self, nsid)
    }
}
