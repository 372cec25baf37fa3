//! Buffers for a controller reached over a socket: a [`DmaSpace`] whose
//! "IOMMU" maps nothing, because no device ever reads or writes host
//! memory — the queue pair copies between the socket and the buffer
//! itself ([`crate::IoBuf::segment_host`]). The space exists so the
//! application allocates [`crate::DmaBuf`]s the same way on every wire and
//! the blocking helpers find their bounce buffer.

use std::ptr::NonNull;
use std::sync::Arc;

use mcqio_vfio::{DmaDir, DmaSpace, HugePages, Iommu, IommuCounters, IommuError, Iova, IovaRange};

/// The IOVA window handed out: addresses are only names here (nothing
/// translates them), so any large range serves.
const WINDOW: IovaRange = IovaRange {
    start: 1 << 20,
    end: 1 << 47,
};

/// No device, no translation: `map` and `unmap` only count.
#[derive(Debug, Default)]
pub(crate) struct NoDevice {
    counters: IommuCounters,
}

// SAFETY: no device can reach host memory through this "IOMMU" at any time
// (it programs nothing), so after `unmap` returns nothing can reach the
// unmapped memory — it never could.
unsafe impl Iommu for NoDevice {
    unsafe fn map(
        &self,
        _iova: Iova,
        _vaddr: NonNull<u8>,
        len: usize,
        _dir: DmaDir,
    ) -> Result<(), IommuError> {
        self.counters.on_map(len as u64);
        Ok(())
    }

    fn unmap(&self, _iova: Iova, len: u64) -> Result<(), IommuError> {
        self.counters.on_unmap(1, len, 0);
        Ok(())
    }

    fn valid_ranges(&self) -> Vec<IovaRange> {
        vec![WINDOW]
    }

    fn counters(&self) -> &IommuCounters {
        &self.counters
    }
}

/// A fresh space of host memory for one controller.
pub(crate) fn host_space() -> Arc<DmaSpace> {
    DmaSpace::new(Arc::new(NoDevice::default()), HugePages::Prefer)
}
