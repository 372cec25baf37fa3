//! Strict mode: map before submission, unmap (with invalidation) at completion.

use std::cell::Cell;
use std::iter;
use std::marker::PhantomData;
use std::sync::Arc;

use super::pool::map_pool_buf;
use super::window::IovaWindow;
use super::{
    mapped_len, next_mapper_id, DmaMapper, DmaMode, IoBuffer, MapError, MapFailed, MapKind, Mapped,
    MapperStats, Returned,
};
use crate::dma::{DmaSpace, PAGE_SIZE};
use crate::iommu::DmaDir;

/// Strict mode: every I/O costs one map, one unmap and one IOTLB
/// invalidation; the buffer is handed back as soon as the unmap returned.
///
/// Pool buffers ([`IoBuffer::Pool`]) are accepted too and cost nothing.
pub struct StrictMapper {
    win: IovaWindow,
    id: u32,
    stats: MapperStats,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for StrictMapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StrictMapper")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl StrictMapper {
    /// A mapper with its own `window_len`-byte IOVA window in `space`.
    pub fn new(space: &Arc<DmaSpace>, window_len: u64) -> Result<Self, MapError> {
        Ok(Self {
            win: IovaWindow::new(space, window_len)?,
            id: next_mapper_id(),
            stats: MapperStats::default(),
            _not_sync: PhantomData,
        })
    }
}

/// Map an application buffer into `win` (shared by strict and lazy).
pub(crate) fn map_app(
    win: &mut IovaWindow,
    buf: IoBuffer,
    len: usize,
    dir: DmaDir,
    tag: u64,
    mapper: u32,
    stats: &mut MapperStats,
) -> Result<Mapped, MapFailed> {
    let transfer_len = len;
    // The device may use whole controller pages from byte 0; the IOMMU
    // mapping covers the granules those touch.
    let len = match mapped_len(buf.len(), len, PAGE_SIZE) {
        Ok(l) => l,
        Err(error) => return Err(MapFailed { error, buf }),
    };
    match win.map(&buf, len, dir) {
        Ok((iova, map_len)) => {
            stats.maps += 1;
            stats.pin(map_len);
            Ok(Mapped {
                iova,
                len,
                transfer_len,
                dir,
                tag,
                kind: MapKind::Window,
                mapper,
                space: win.space().id(),
                buf: Some(buf),
            })
        }
        Err(error) => Err(MapFailed { error, buf }),
    }
}

impl DmaMapper for StrictMapper {
    fn mode(&self) -> DmaMode {
        DmaMode::Strict
    }

    fn map(
        &mut self,
        buf: IoBuffer,
        len: usize,
        dir: DmaDir,
        tag: u64,
    ) -> Result<Mapped, MapFailed> {
        match buf {
            IoBuffer::Pool(b) => {
                map_pool_buf(self.win.space(), b, len, dir, tag, self.id, &mut self.stats)
            }
            app => map_app(&mut self.win, app, len, dir, tag, self.id, &mut self.stats),
        }
    }

    fn release(&mut self, mut m: Mapped, out: &mut Vec<Returned>) -> Result<(), MapError> {
        if m.mapper() != self.id {
            return Err(MapError::ForeignMapping { iova: m.iova() });
        }
        let tag = m.tag();
        if m.kind() == MapKind::Window {
            let (iova, len) = self.win.mapping_of(&m)?;
            if let Err(e) = self.win.space().iommu().unmap(iova, len) {
                // The device may still reach the buffer: `m` leaks it on drop.
                return Err(e.into());
            }
            self.win.unmapped(iova, len);
            self.stats.on_unmap_call(iter::once((1, len)));
        }
        out.push(Returned {
            tag,
            buf: m.take_buf(),
        });
        Ok(())
    }

    fn stats(&self) -> MapperStats {
        MapperStats {
            iommu: self.win.space().iommu().counters().snapshot(),
            ..self.stats
        }
    }
}
