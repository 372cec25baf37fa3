//! Where the rw workers' buffers come from: the engine's DmaBufs, the DMA
//! mapping modes, or vectored lists of pages.

use super::*;

/// Where a worker's buffers come from: the engine's own [`DmaBuf`]s, or one
/// of the DMA mapping modes. A buffer is taken for each command and handed
/// back at completion; the lane reports when its data may be looked at.
pub(crate) trait Lane {
    /// What the queue pair moves (an `IoBuf`, or an application buffer
    /// the engine maps itself).
    type B;
    /// A free buffer holding `data` (writes) or poisoned (reads), ready to
    /// submit for a `len`-byte transfer; `None` while every buffer is busy.
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<Self::B>, Failure>;
    /// The buffer of the completed command `tag`. Buffers the device can no
    /// longer reach (this one, or in lazy mode a batch, later) are reported
    /// through `done(tag, contents)`.
    fn give(
        &mut self,
        b: Self::B,
        tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure>;
    /// Called on every reaping pass (lazy mode flushes on a timer here).
    /// Lanes that defer nothing have nothing to do.
    fn tick(&mut self, _done: &mut dyn FnMut(u64, &[u8])) -> Result<(), Failure> {
        Ok(())
    }
    /// Force every deferred release (end of a phase).
    fn drain(&mut self, _done: &mut dyn FnMut(u64, &[u8])) -> Result<(), Failure> {
        Ok(())
    }
    /// One line about the lane's mapping work.
    fn describe(&self) -> String;
}

/// Buffers are [`DmaBuf`]s mapped once.
pub(crate) struct DmaBufLane {
    pub(crate) free: Vec<DmaBuf>,
    pub(crate) lens: HashMap<u64, usize>,
    pub(crate) scratch: Vec<u8>,
}

impl DmaBufLane {
    pub(crate) fn new(ctrl: &Controller, count: usize, size: usize) -> Result<Self, Failure> {
        let free = (0..count)
            .map(|_| ctrl.alloc_buf(size, DmaDir::Bidirectional))
            .collect::<Result<_, _>>()
            .map_err(ctx("allocating DMA buffers"))?;
        Ok(Self {
            free,
            lens: HashMap::new(),
            scratch: vec![0; size],
        })
    }
}

impl Lane for DmaBufLane {
    type B = DmaBuf;
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<DmaBuf>, Failure> {
        let Some(mut b) = self.free.pop() else {
            return Ok(None);
        };
        match data {
            Some(d) => b.write_at(0, d).map_err(ctx("filling a buffer"))?,
            None => b.fill(POISON),
        }
        self.lens.insert(tag, len);
        Ok(Some(b))
    }
    fn give(
        &mut self,
        b: DmaBuf,
        tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure> {
        // Mapped once: the data may be looked at as soon as the command completed.
        let len = self.lens.remove(&tag).unwrap_or(0);
        let data = &mut self.scratch[..len];
        b.read_at(0, data).map_err(ctx("reading a buffer"))?;
        done(tag, data);
        self.free.push(b);
        Ok(())
    }
    fn describe(&self) -> String {
        format!("{} DmaBufs mapped once", self.free.len())
    }
}

/// Application buffers the engine's `MappedQueuePair` maps and unmaps:
/// a buffer it hands back is no longer reachable by the device, so its
/// data may be looked at at once.
pub(crate) struct AppLane {
    pub(crate) free: Vec<AppBuffer>,
    pub(crate) lens: HashMap<u64, usize>,
    pub(crate) mode: DmaMode,
}

impl AppLane {
    pub(crate) fn new(
        dma: &Arc<mcqio::vfio::DmaSpace>,
        mode: DmaMode,
        count: usize,
        size: usize,
    ) -> Result<Self, Failure> {
        let free = (0..count)
            .map(|_| AppBuffer::for_space(dma, size))
            .collect::<Result<_, _>>()
            .map_err(ctx("allocating application buffers"))?;
        Ok(Self {
            free,
            lens: HashMap::new(),
            mode,
        })
    }
}

impl Lane for AppLane {
    type B = AppBuffer;
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<AppBuffer>, Failure> {
        let Some(mut b) = self.free.pop() else {
            return Ok(None);
        };
        match data {
            Some(d) => b.as_mut_slice()[..d.len()].copy_from_slice(d),
            None => b.as_mut_slice()[..len].fill(POISON),
        }
        self.lens.insert(tag, len);
        Ok(Some(b))
    }
    fn give(
        &mut self,
        b: AppBuffer,
        tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure> {
        let len = self.lens.remove(&tag).unwrap_or(0);
        done(tag, &b.as_slice()[..len]);
        self.free.push(b);
        Ok(())
    }
    fn describe(&self) -> String {
        format!(
            "{} application buffers, mapped by the engine's MappedQueuePair ({})",
            self.free.len(),
            self.mode
        )
    }
}

/// Buffers go through a [`QueueMapper`] (premapped pool, strict or lazy).
pub(crate) struct MapperLane {
    pub(crate) mapper: QueueMapper,
    pub(crate) free: Vec<IoBuffer>,
    pub(crate) lens: HashMap<u64, usize>,
    pub(crate) scratch: Vec<u8>,
    pub(crate) returned: Vec<Returned>,
}

impl MapperLane {
    pub(crate) fn new(
        ctrl: &Controller,
        mode: DmaMode,
        count: usize,
        size: usize,
    ) -> Result<Self, Failure> {
        Self::for_space(ctrl.dma(), mode, count, size)
    }

    /// The same on any DMA space (a UFS controller's, too).
    pub(crate) fn for_space(
        dma: &Arc<mcqio::vfio::DmaSpace>,
        mode: DmaMode,
        count: usize,
        size: usize,
    ) -> Result<Self, Failure> {
        let cfg = MapperConfig {
            pool: PoolConfig {
                buf_size: size,
                count,
            },
            ..MapperConfig::with_mode(mode)
        };
        let mut mapper = QueueMapper::new(dma, &cfg).map_err(ctx("creating the DMA mapper"))?;
        let free = match mapper.pool() {
            Some(pool) => (0..count)
                .map(|_| pool.alloc().map(IoBuffer::Pool))
                .collect::<Result<_, _>>()
                .map_err(ctx("taking pool buffers"))?,
            None => (0..count)
                .map(|_| AppBuffer::for_space(dma, size).map(IoBuffer::App))
                .collect::<Result<_, _>>()
                .map_err(ctx("allocating application buffers"))?,
        };
        Ok(Self {
            mapper,
            free,
            lens: HashMap::new(),
            scratch: vec![0; size],
            returned: Vec::new(),
        })
    }

    pub(crate) fn deliver(&mut self, done: &mut dyn FnMut(u64, &[u8])) {
        for Returned { tag, buf } in self.returned.drain(..) {
            let len = self.lens.remove(&tag).unwrap_or(0);
            let data = &mut self.scratch[..len];
            match &buf {
                IoBuffer::Pool(p) => p
                    .read_bytes(0, data)
                    .expect("the transfer length fits the pool buffer"),
                IoBuffer::App(a) => data.copy_from_slice(&a.as_slice()[..len]),
            }
            done(tag, data);
            self.free.push(buf);
        }
    }
}

impl Lane for MapperLane {
    type B = Mapped;
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<Mapped>, Failure> {
        let Some(mut b) = self.free.pop() else {
            return Ok(None);
        };
        match (&mut b, data) {
            (IoBuffer::Pool(p), Some(d)) => p.write_bytes(0, d).map_err(ctx("filling a buffer"))?,
            (IoBuffer::Pool(p), None) => p
                .write_bytes(0, &vec![POISON; len])
                .map_err(ctx("poisoning a buffer"))?,
            (IoBuffer::App(a), Some(d)) => a.as_mut_slice()[..d.len()].copy_from_slice(d),
            (IoBuffer::App(a), None) => a.as_mut_slice()[..len].fill(POISON),
        }
        let dir = if data.is_some() {
            DmaDir::ToDevice
        } else {
            DmaDir::FromDevice
        };
        self.lens.insert(tag, len);
        self.mapper
            .map(b, len, dir, tag)
            .map(Some)
            .map_err(|f| format!("mapping a {len}-byte buffer: {}", f.error))
    }
    fn give(
        &mut self,
        m: Mapped,
        _tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure> {
        self.mapper
            .release(m, &mut self.returned)
            .map_err(ctx("releasing a mapping"))?;
        self.deliver(done);
        Ok(())
    }
    fn tick(&mut self, done: &mut dyn FnMut(u64, &[u8])) -> Result<(), Failure> {
        self.mapper
            .poll(&mut self.returned)
            .map_err(ctx("polling the mapper"))?;
        self.deliver(done);
        Ok(())
    }
    fn drain(&mut self, done: &mut dyn FnMut(u64, &[u8])) -> Result<(), Failure> {
        self.mapper
            .flush(&mut self.returned)
            .map_err(ctx("flushing the mapper"))?;
        self.deliver(done);
        Ok(())
    }
    fn describe(&self) -> String {
        let s = self.mapper.stats();
        format!(
            "{} mode: {} maps, {} premapped I/Os, {} unmaps in {} unmap calls, peak {} KiB pinned",
            self.mapper.mode(),
            s.maps,
            s.premapped_ios,
            s.unmaps,
            s.unmap_calls,
            s.peak_bytes_pinned >> 10
        )
    }
}

/// Vectored buffers: every slot is a list of 4 KiB pages cut from one DMA
/// buffer and shuffled, so a command's segments are scattered in IOVA space
/// and its PRP list has to name each page on its own.
pub(crate) struct VecLane {
    pub(crate) free: Vec<Vec<DmaBuf>>,
    /// Pages of a slot not used by the command in flight, by tag.
    pub(crate) spare: HashMap<u64, Vec<DmaBuf>>,
    pub(crate) lens: HashMap<u64, usize>,
    pub(crate) scratch: Vec<u8>,
}

impl VecLane {
    pub(crate) const PAGE: usize = 4096;

    pub(crate) fn new(
        ctrl: &Controller,
        count: usize,
        size: usize,
        seed: u64,
    ) -> Result<Self, Failure> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut free = Vec::with_capacity(count);
        for _ in 0..count {
            let mut pages = ctrl
                .alloc_buf(size, DmaDir::Bidirectional)
                .and_then(|b| b.chunks(Self::PAGE).map_err(Into::into))
                .map_err(ctx("allocating DMA pages"))?;
            pages.shuffle(&mut rng);
            free.push(pages);
        }
        Ok(Self {
            free,
            spare: HashMap::new(),
            lens: HashMap::new(),
            scratch: vec![0; size],
        })
    }
}

impl Lane for VecLane {
    type B = Vec<DmaBuf>;
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<Vec<DmaBuf>>, Failure> {
        let Some(mut pages) = self.free.pop() else {
            return Ok(None);
        };
        let rest = pages.split_off(len.div_ceil(Self::PAGE).min(pages.len()));
        for (i, p) in pages.iter_mut().enumerate() {
            match data {
                Some(d) => {
                    let chunk = &d[i * Self::PAGE..((i + 1) * Self::PAGE).min(d.len())];
                    p.write_at(0, chunk).map_err(ctx("filling a page"))?;
                }
                None => p.fill(POISON),
            }
        }
        self.spare.insert(tag, rest);
        self.lens.insert(tag, len);
        Ok(Some(pages))
    }
    fn give(
        &mut self,
        mut pages: Vec<DmaBuf>,
        tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure> {
        let len = self.lens.remove(&tag).unwrap_or(0);
        for (i, p) in pages.iter().enumerate() {
            let at = i * Self::PAGE;
            if at >= len {
                break;
            }
            let end = (at + Self::PAGE).min(len);
            p.read_at(0, &mut self.scratch[at..end])
                .map_err(ctx("reading a page"))?;
        }
        done(tag, &self.scratch[..len]);
        pages.extend(self.spare.remove(&tag).unwrap_or_default());
        self.free.push(pages);
        Ok(())
    }
    fn describe(&self) -> String {
        format!(
            "{} slots of scattered 4 KiB DmaBufs mapped once",
            self.free.len()
        )
    }
}
