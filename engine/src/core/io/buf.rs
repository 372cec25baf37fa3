//! The buffers of the I/O API: the [`IoBuf`] contract, [`DmaBuf`],
//! [`DmaSlice`] and their segments ([`IoSeg`]) (see the module docs of
//! [`crate::core::io`] for ownership and the PRP rules).

use std::fmt;
use std::num::NonZeroU64;
use std::ptr::NonNull;
use std::sync::Arc;

use mcqio_vfio::{DmaDir, DmaError, DmaRegion, DmaSpace, Iova};

/// One IOVA-contiguous piece of an I/O buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IoSeg {
    /// Device address of the first byte.
    pub iova: Iova,
    /// Length in bytes.
    pub len: usize,
}

/// Memory the device may read or write for a command.
///
/// # Safety
///
/// An implementor promises that, for as long as the value is alive (and it
/// may be moved — moving must not move or free the memory):
/// - every segment `[iova, iova + len)` is mapped in the IOMMU of the space
///   for which [`IoBuf::is_mapped_in`] returns true, with at least the
///   direction [`IoBuf::dir`] reports, onto host memory that stays allocated;
/// - no Rust reference to that memory exists while the value is held by a
///   queue pair (the device writes it concurrently);
/// - `segment_count`, `segment`, `dir` and `is_mapped_in` return the same
///   answers every time;
/// - [`IoBuf::usable_in`] with the key [`IoBuf::space_key`] gave for a
///   space returns true exactly when `check_dir` is `Ok` and
///   `is_mapped_in` is true for that space;
/// - [`IoBuf::segment_host`], where it is `Some`, is the host address of
///   the same bytes segment `i` maps, valid for `len` bytes as long as the
///   value lives.
pub unsafe trait IoBuf: Send {
    /// Number of segments (at least 1).
    fn segment_count(&self) -> usize;
    /// Segment `i` (`i < segment_count()`).
    fn segment(&self, i: usize) -> IoSeg;
    /// Which way the device may move data through this buffer.
    fn dir(&self) -> DmaDir;
    /// The host address of segment `i`'s bytes, for a wire that copies
    /// instead of DMAing (a socket): it reads and writes them while the
    /// queue pair holds the buffer, as a device would. `None` (the
    /// default): no host view, and such a wire refuses the buffer.
    #[inline]
    fn segment_host(&self, _i: usize) -> Option<std::ptr::NonNull<u8>> {
        None
    }
    /// Whether the buffer is mapped in `space` (the controller's DMA space).
    fn is_mapped_in(&self, space: &DmaSpace) -> bool;
    /// A word standing for `space` in [`IoBuf::usable_in`], computed once
    /// per queue pair. The default: the space's id (unused by the default
    /// `usable_in`).
    #[inline]
    fn space_key(space: &DmaSpace) -> u64
    where
        Self: Sized,
    {
        space.id()
    }
    /// [`IoBuf::check_dir`] and [`IoBuf::is_mapped_in`] together, for a
    /// queue's hot path: whether the buffer is mapped in `space`, whose
    /// [`IoBuf::space_key`] is `key`, in the direction a command needs
    /// (`device_writes`: a read). `false` sends the caller to the two
    /// checks for the reason. The default asks both; a buffer type that
    /// can answer with one compare against `key` overrides it.
    #[inline]
    fn usable_in(&self, space: &DmaSpace, key: u64, device_writes: bool) -> bool {
        let _ = key;
        self.check_dir(device_writes).is_ok() && self.is_mapped_in(space)
    }
    /// Total bytes over all segments.
    #[inline]
    fn total_len(&self) -> usize {
        (0..self.segment_count()).map(|i| self.segment(i).len).sum()
    }
    /// Whether every segment lets the device write into it
    /// (`device_writes`, a read command) or read from it (a write
    /// command): `Err` with the direction of a segment that does not.
    /// The default checks [`IoBuf::dir`]; a buffer whose segments may be
    /// mapped differently overrides it.
    #[inline]
    fn check_dir(&self, device_writes: bool) -> Result<(), DmaDir> {
        let d = self.dir();
        let ok = if device_writes {
            d.device_writes()
        } else {
            d.device_reads()
        };
        if ok {
            Ok(())
        } else {
            Err(d)
        }
    }
}

/// A slice of a [`DmaRegion`]: memory the device can reach.
///
/// `DmaBuf`s made from one region never overlap: a region becomes one buffer
/// ([`DmaBuf::new`]) that can only be divided ([`DmaBuf::split_at`],
/// [`DmaBuf::chunks`]), and the region they share ([`DmaBuf::region`]) gives
/// no access to the bytes. So a `DmaBuf` that is not in flight is exclusively
/// owned, copying in and out of it is an ordinary memcpy, and the borrow
/// rules (`read_at` on `&self`, `write_at` on `&mut self`) keep threads from
/// racing on it.
pub struct DmaBuf {
    region: Arc<DmaRegion>,
    // 32-bit offset and length keep a DmaBuf at 16 bytes: it is moved into
    // and out of a tracker on every I/O, and the smaller move measured ~10%
    // less engine CPU per I/O than 24 bytes (40 bytes was far worse).
    offset: u32,
    len: u32,
}

/// The largest region a [`DmaBuf`] can cover (4 GiB - 1 page).
pub const DMA_BUF_MAX_REGION: usize = (u32::MAX as usize + 1) - mcqio_vfio::PAGE_SIZE;

fn too_big(len: usize) -> DmaError {
    DmaError::OutOfBounds {
        offset: 0,
        len,
        size: DMA_BUF_MAX_REGION,
    }
}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf")
            .field("iova", &self.iova())
            .field("len", &self.len)
            .finish()
    }
}

impl DmaBuf {
    /// The whole region as one buffer. Regions over [`DMA_BUF_MAX_REGION`]
    /// bytes are refused: split such memory into several regions.
    pub fn new(region: DmaRegion) -> Result<Self, DmaError> {
        let len = region.len();
        if len > DMA_BUF_MAX_REGION {
            return Err(too_big(len));
        }
        Ok(DmaBuf {
            region: Arc::new(region),
            offset: 0,
            len: len as u32,
        })
    }

    /// Allocate a new region of `len` bytes (rounded up to pages) in `space`
    /// and make it one buffer of exactly `len` bytes (at most
    /// [`DMA_BUF_MAX_REGION`]).
    pub fn alloc(space: &Arc<DmaSpace>, len: usize, dir: DmaDir) -> Result<Self, DmaError> {
        if len > DMA_BUF_MAX_REGION {
            return Err(too_big(len));
        }
        let region = space.alloc(len, dir)?;
        Ok(DmaBuf {
            region: Arc::new(region),
            offset: 0,
            len: len as u32,
        })
    }

    /// Split into `[0, mid)` and `[mid, len)`. Fails if `mid > len`.
    pub fn split_at(self, mid: usize) -> Result<(DmaBuf, DmaBuf), DmaError> {
        let mid32 = mid as u32;
        if mid > self.len as usize {
            return Err(DmaError::OutOfBounds {
                offset: mid,
                len: 0,
                size: self.len as usize,
            });
        }
        let tail = DmaBuf {
            region: Arc::clone(&self.region),
            offset: self.offset + mid32,
            len: self.len - mid32,
        };
        let head = DmaBuf {
            region: self.region,
            offset: self.offset,
            len: mid32,
        };
        Ok((head, tail))
    }

    /// Cut into consecutive buffers of `size` bytes (the last one may be
    /// shorter). `size` must not be zero.
    ///
    /// One allocation (one IOMMU mapping) cut into per-request buffers,
    /// each of which then travels through a queue pair on its own:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mcqio::{Controller, ControllerOptions, QpairOptions, vfio::{Backend, DmaDir}};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend: Arc<dyn Backend> = mcqio_fixtures::FakeController::new(Default::default())?;
    /// let ctrl = Controller::new(backend, ControllerOptions::default())?;
    /// let bufs = ctrl.alloc_buf(4 * 4096 + 512, DmaDir::Bidirectional)?.chunks(4096)?;
    /// let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
    /// assert_eq!(lens, [4096, 4096, 4096, 4096, 512]);
    ///
    /// let mut qp = ctrl.create_qpair(QpairOptions::default())?;
    /// for (i, b) in bufs.into_iter().enumerate() {
    ///     let nlb = (b.len() / 512) as u32;
    ///     qp.read(1, 8 * i as u64, nlb, b, i as u64).map_err(|e| e.kind)?;
    /// }
    /// qp.submit();
    /// let mut back = Vec::new();
    /// while back.len() < 5 {
    ///     qp.poll(32, |c| back.push(c))?;
    /// }
    /// assert!(back.iter().all(|c| c.result.is_ok() && c.buf.is_some()));
    /// assert!(ctrl.alloc_buf(4096, DmaDir::Bidirectional)?.chunks(0).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn chunks(self, size: usize) -> Result<Vec<DmaBuf>, DmaError> {
        if size == 0 {
            return Err(DmaError::ZeroLength);
        }
        let mut out = Vec::with_capacity((self.len as usize).div_ceil(size));
        let mut rest = self;
        while rest.len as usize > size {
            let (a, b) = rest.split_at(size)?;
            out.push(a);
            rest = b;
        }
        out.push(rest);
        Ok(out)
    }

    /// Device address of byte 0.
    #[inline]
    pub fn iova(&self) -> Iova {
        self.region.iova().add(self.offset as u64)
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the buffer is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host pointer to byte 0 (for volatile access or memcpy while the
    /// buffer is not in flight).
    #[inline]
    pub fn as_ptr(&self) -> NonNull<u8> {
        // SAFETY: `offset <= region.len()` is an invariant of every constructor.
        unsafe { self.region.as_ptr().add(self.offset as usize) }
    }

    /// The region this buffer is part of (for its IOVA, length and
    /// direction, or IOMMU experiments). The region is shared with every
    /// buffer cut from it, some of which may be in flight or in another
    /// thread's hands, so it gives addresses only: its byte accessors need
    /// `&mut DmaRegion`, which a shared region never gives. Use this
    /// buffer's own [`read_at`](Self::read_at)/[`write_at`](Self::write_at).
    ///
    /// ```compile_fail,E0596
    /// fn peek(buf: &mcqio::DmaBuf) -> u32 {
    ///     // Would read bytes of a sibling buffer that another thread writes.
    ///     buf.region().read_obj(0).unwrap()
    /// }
    /// ```
    pub fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len as usize => Ok(()),
            _ => Err(DmaError::OutOfBounds {
                offset,
                len,
                size: self.len as usize,
            }),
        }
    }

    /// Copy `src` into the buffer at `offset`.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.check(offset, src.len())?;
        // SAFETY: bounds checked; the buffer is not in flight (we hold it by
        // `&mut`, and a queue pair holds in-flight buffers by value), no
        // other DmaBuf overlaps it (type invariant), and the shared region
        // offers no byte access (its accessors need `&mut DmaRegion`, which
        // an `Arc` shared with sibling buffers never gives), so nothing else
        // reads or writes these bytes during the copy. No reference is formed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.as_ptr().as_ptr().add(offset),
                src.len(),
            )
        };
        Ok(())
    }

    /// Copy `dst.len()` bytes out of the buffer starting at `offset`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.check(offset, dst.len())?;
        // SAFETY: bounds checked; not in flight and not overlapped (see
        // `write_at`). The device's writes were ordered before the completion
        // by the queue's `barrier::loads_after_phase`, which happened before we got it back.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.as_ptr().as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Fill the whole buffer with `byte`.
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: in bounds by construction; exclusive as in `write_at`.
        unsafe { std::ptr::write_bytes(self.as_ptr().as_ptr(), byte, self.len as usize) };
    }

    /// The buffer's bytes, borrowed: read them in place instead of copying
    /// them out with [`read_at`](Self::read_at).
    ///
    /// Sound because a `DmaBuf` the application holds is one the device no
    /// longer touches and nothing else in safe code can reach:
    /// - a queue pair takes the buffer by value on submit and hands it back
    ///   only once the device is done with it (completed, abort confirmed,
    ///   or controller disabled by a reset; [`SubmitError`](crate::core::io::SubmitError) hands back a
    ///   buffer never posted); a buffer the device may still reach is
    ///   leaked, its completion comes with `buf: None`, so the application
    ///   never holds it again;
    /// - the borrow keeps the buffer from being submitted (or split, or
    ///   dropped) while the slice lives;
    /// - buffers cut from one region never overlap, and the region they
    ///   share gives no byte access ([`region`](Self::region));
    /// - handing the same memory to the device another way (a [`DmaSlice`]
    ///   of this buffer's IOVA, an own [`IoBuf`]) takes `unsafe` code whose
    ///   contract forbids any host reference to the memory while a command
    ///   carrying it is in flight.
    ///
    /// It trusts the device as [`read_at`](Self::read_at) does: a device
    /// writes only the buffers of commands in flight. The region stays
    /// mapped in the IOMMU for its whole life, so a faulty device that
    /// wrote a buffer after its completion would corrupt what the slice
    /// shows (as it would corrupt a copy made by `read_at`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mcqio::{Controller, ControllerOptions, QpairOptions, vfio::{Backend, DmaDir}};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend: Arc<dyn Backend> = mcqio_fixtures::FakeController::new(Default::default())?;
    /// let ctrl = Controller::new(backend, ControllerOptions::default())?;
    /// let mut qp = ctrl.create_qpair(QpairOptions::default())?;
    /// let mut buf = ctrl.alloc_buf(512, DmaDir::Bidirectional)?;
    /// buf.as_mut_slice()[..4].copy_from_slice(b"mcq!");
    /// qp.write(1, 0, 1, buf, 1).map_err(|e| e.kind)?;
    /// qp.submit();
    /// // `buf` is the queue pair's now: no view of it can be taken.
    /// let back = ctrl.alloc_buf(512, DmaDir::Bidirectional)?;
    /// let mut done = Vec::new();
    /// while done.is_empty() {
    ///     qp.poll(8, |c| done.push(c))?;
    /// }
    /// qp.read(1, 0, 1, back, 2).map_err(|e| e.kind)?;
    /// qp.submit();
    /// while done.len() < 2 {
    ///     qp.poll(8, |c| done.push(c))?;
    /// }
    /// let back = done[1].buf.as_ref().ok_or("buffer leaked")?;
    /// assert_eq!(&back.as_slice()[..4], b"mcq!");
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `as_ptr()..+len` lies inside the live, initialised (zeroed
        // at allocation) host memory of the region, which the Arc keeps
        // alive for as long as `self` is borrowed; nothing writes it while
        // the slice lives (not in flight, no overlapping DmaBuf, no byte
        // access through the region: see the doc above and `write_at`), and
        // the device's writes of the last command were ordered before its
        // completion (`barrier::loads_after_phase`).
        unsafe { std::slice::from_raw_parts(self.as_ptr().as_ptr(), self.len as usize) }
    }

    /// The buffer's bytes, borrowed mutably: fill them in place instead of
    /// copying them in with [`write_at`](Self::write_at). Sound for the
    /// reasons given on [`as_slice`](Self::as_slice); `&mut self` makes the
    /// view the only access to these bytes while it lives.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` excludes every other access
        // through this buffer, and no other DmaBuf overlaps it.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().as_ptr(), self.len as usize) }
    }

    /// Copy the contents into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len as usize];
        self.read_at(0, &mut v)
            .expect("whole-buffer read is in bounds");
        v
    }
}

// SAFETY: a `DmaBuf` is a range of a live `DmaRegion` (kept alive by the
// Arc), which is mapped at `region.iova()` in `region.space()` with
// `region.dir()` for its whole life; moving the DmaBuf moves only the Arc.
unsafe impl IoBuf for DmaBuf {
    #[inline]
    fn segment_count(&self) -> usize {
        1
    }
    #[inline]
    fn segment(&self, _i: usize) -> IoSeg {
        IoSeg {
            iova: self.iova(),
            len: self.len as usize,
        }
    }
    #[inline]
    fn dir(&self) -> DmaDir {
        self.region.dir()
    }
    #[inline]
    fn segment_host(&self, _i: usize) -> Option<std::ptr::NonNull<u8>> {
        // SAFETY: `offset + len` lies inside the region (every constructor
        // checks it), so the offset pointer stays inside its allocation.
        Some(unsafe { self.region.as_ptr().add(self.offset as usize) })
    }
    #[inline]
    fn is_mapped_in(&self, space: &DmaSpace) -> bool {
        // By id, like `Mapped`: one identity rule for every buffer type.
        self.region.space().id() == space.id()
    }
    #[inline]
    fn total_len(&self) -> usize {
        self.len as usize
    }
}

fn common_dir(a: DmaDir, b: DmaDir) -> DmaDir {
    match (
        a.device_reads() && b.device_reads(),
        a.device_writes() && b.device_writes(),
    ) {
        (true, true) => DmaDir::Bidirectional,
        (true, false) => DmaDir::ToDevice,
        (false, true) => DmaDir::FromDevice,
        // No direction both allow: there is no DmaDir for "neither", so
        // `dir` reports the first; `check_dir` looks at every element.
        (false, false) => a,
    }
}

// SAFETY: each element upholds the contract for its own segment; the Vec
// owns them, so they live exactly as long as the Vec. `dir` is the
// intersection of the elements' directions when one exists; `check_dir`
// checks every element, so a transfer is refused unless all allow it.
unsafe impl<B: IoBuf> IoBuf for Vec<B> {
    fn segment_count(&self) -> usize {
        self.iter().map(|b| b.segment_count()).sum()
    }
    fn segment(&self, mut i: usize) -> IoSeg {
        for b in self {
            let n = b.segment_count();
            if i < n {
                return b.segment(i);
            }
            i -= n;
        }
        IoSeg {
            iova: Iova(0),
            len: 0,
        }
    }
    fn segment_host(&self, mut i: usize) -> Option<std::ptr::NonNull<u8>> {
        for b in self {
            let n = b.segment_count();
            if i < n {
                return b.segment_host(i);
            }
            i -= n;
        }
        None
    }
    fn dir(&self) -> DmaDir {
        self.iter()
            .map(|b| b.dir())
            .fold(DmaDir::Bidirectional, common_dir)
    }
    fn check_dir(&self, device_writes: bool) -> Result<(), DmaDir> {
        self.iter().try_for_each(|b| b.check_dir(device_writes))
    }
    fn is_mapped_in(&self, space: &DmaSpace) -> bool {
        self.iter().all(|b| b.is_mapped_in(space))
    }
}

/// A slice of DMA memory the application mapped itself, as a queue pair
/// moves it: an IOVA, a length and the id of the space it is mapped in
/// with its direction — three words, no reference count, nothing handed
/// back that must be stored. For engines that premap one region per
/// thread and cut it into per-command slices (mcqio-perf's job queues, the
/// fio engine).
///
/// Safe to copy and to pass around: it gives no access to the bytes. The
/// contract is on [`DmaSlice::new`].
///
/// Three words, not four: the direction rides in the low two bits of the
/// space id's word (bit 0: the device may read, bit 1: it may write), so a
/// slice is copied with three loads and stores into the tracker and back
/// (it was 32 bytes with a one-byte field copied piecewise with its
/// padding), and `Option<DmaSlice>` is as small (the word is
/// never 0).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DmaSlice {
    iova: Iova,
    len: usize,
    /// `space id << 2 | DIR_READS | DIR_WRITES` as the direction allows.
    space_dir: NonZeroU64,
}

// Three words, and `None` costs no fourth.
#[cfg(target_pointer_width = "64")]
const _: () =
    assert!(std::mem::size_of::<DmaSlice>() == 24 && std::mem::size_of::<Option<DmaSlice>>() == 24);

/// [`DmaSlice::space_dir`]: the device may read through the slice.
const DIR_READS: u64 = 1;
/// [`DmaSlice::space_dir`]: the device may write through the slice.
const DIR_WRITES: u64 = 2;

impl DmaSlice {
    /// The slice `[iova, iova + len)` of memory mapped in `space` for `dir`.
    ///
    /// # Safety
    ///
    /// - The range lies inside memory mapped in `space` with (at least) the
    ///   access `dir` says, and stays mapped, and allocated, for as long as
    ///   the device may access it: until every command that carried a copy
    ///   of this slice completed **with its buffer handed back**. A
    ///   completion without its buffer means the device may still access
    ///   the memory; it must then be leaked, never unmapped or reused.
    /// - While a command carrying it is in flight, no Rust reference to that
    ///   memory exists and the host does not access it (the device has
    ///   concurrent read and write access to it).
    ///
    /// # Panics
    ///
    /// If the space's id does not fit 62 bits (ids count up from 1, one
    /// per space created: not within any process's lifetime).
    pub unsafe fn new(space: &DmaSpace, iova: Iova, len: usize, dir: DmaDir) -> Self {
        let id = space.id();
        assert!(id >> 62 == 0, "DMA space id {id} does not fit a DmaSlice");
        let bits = match dir {
            DmaDir::ToDevice => DIR_READS,
            DmaDir::FromDevice => DIR_WRITES,
            DmaDir::Bidirectional => DIR_READS | DIR_WRITES,
        };
        DmaSlice {
            iova,
            len,
            // Never 0: the direction's bits are never both clear.
            space_dir: NonZeroU64::new(id << 2 | bits).expect("direction bits set"),
        }
    }

    /// Where the slice starts in the device's address space.
    pub fn iova(&self) -> Iova {
        self.iova
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The id of the space it is mapped in.
    fn space_id(&self) -> u64 {
        self.space_dir.get() >> 2
    }
}

impl fmt::Debug for DmaSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaSlice")
            .field("iova", &self.iova)
            .field("len", &self.len)
            .field("dir", &self.dir())
            .field("space_id", &self.space_id())
            .finish()
    }
}

// SAFETY: the answers below come from fields that never change; that the
// range is mapped in the space with id `space_id` for `dir`, and stays so
// while the device may access it, is the contract of `DmaSlice::new`, the
// only constructor.
unsafe impl IoBuf for DmaSlice {
    #[inline]
    fn segment_count(&self) -> usize {
        1
    }
    #[inline]
    fn segment(&self, _i: usize) -> IoSeg {
        IoSeg {
            iova: self.iova,
            len: self.len,
        }
    }
    #[inline]
    fn dir(&self) -> DmaDir {
        match self.space_dir.get() & (DIR_READS | DIR_WRITES) {
            DIR_READS => DmaDir::ToDevice,
            DIR_WRITES => DmaDir::FromDevice,
            _ => DmaDir::Bidirectional,
        }
    }
    #[inline]
    fn check_dir(&self, device_writes: bool) -> Result<(), DmaDir> {
        // One test of the direction's bit instead of decoding the direction.
        let need = if device_writes { DIR_WRITES } else { DIR_READS };
        if self.space_dir.get() & need != 0 {
            Ok(())
        } else {
            Err(self.dir())
        }
    }
    #[inline]
    fn is_mapped_in(&self, space: &DmaSpace) -> bool {
        self.space_id() == space.id()
    }
    /// `id << 2` with both direction bits: what `space_dir` of a slice of
    /// the space becomes with the bit a command does not need or-ed in,
    /// when it has the bit the command needs. A space whose id does not
    /// fit 62 bits holds no slice (`new`): 0, which no `space_dir` or-ed
    /// with a bit equals.
    #[inline]
    fn space_key(space: &DmaSpace) -> u64 {
        let id = space.id();
        if id >> 62 == 0 {
            id << 2 | DIR_READS | DIR_WRITES
        } else {
            0
        }
    }
    /// One or and one compare for both checks, where the direction's test
    /// and the comparison of ids took seven instructions: the
    /// bit the command does not need or-ed in, `space_dir` equals `key`
    /// exactly when the ids match and the needed bit is set.
    #[inline]
    fn usable_in(&self, _space: &DmaSpace, key: u64, device_writes: bool) -> bool {
        let other = if device_writes { DIR_READS } else { DIR_WRITES };
        self.space_dir.get() | other == key
    }
    #[inline]
    fn total_len(&self) -> usize {
        self.len
    }
}

// SAFETY: a `Mapped` owns its buffer (the memory stays allocated while it
// lives) and describes one IOVA-contiguous mapping of `len()` bytes (we
// report the `transfer_len()` asked for, which is no more) with
// direction `dir()` in the space `is_mapped_in` names, which stays mapped
// until the `Mapped` is handed back to its mapper by value — impossible
// while a queue pair holds it.
unsafe impl IoBuf for mcqio_vfio::Mapped {
    #[inline]
    fn segment_count(&self) -> usize {
        1
    }
    #[inline]
    fn segment(&self, _i: usize) -> IoSeg {
        IoSeg {
            iova: self.iova(),
            len: self.transfer_len(),
        }
    }
    #[inline]
    fn dir(&self) -> DmaDir {
        mcqio_vfio::Mapped::dir(self)
    }
    #[inline]
    fn segment_host(&self, _i: usize) -> Option<std::ptr::NonNull<u8>> {
        self.host_ptr()
    }
    #[inline]
    fn is_mapped_in(&self, space: &DmaSpace) -> bool {
        mcqio_vfio::Mapped::is_mapped_in(self, space)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three-word slice keeps what it was made with: direction (both
    /// ways round), length, IOVA and the space it is mapped in.
    #[test]
    fn a_dma_slice_keeps_its_direction_and_space() {
        let space = || {
            let iommu = mcqio_fixtures::FakeIommu::new(Default::default());
            DmaSpace::new(Arc::new(iommu), mcqio_vfio::HugePages::Never)
        };
        let (a, b) = (space(), space());
        for (dir, reads, writes) in [
            (DmaDir::ToDevice, true, false),
            (DmaDir::FromDevice, false, true),
            (DmaDir::Bidirectional, true, true),
        ] {
            // SAFETY: the slice is only inspected, never given to a device.
            let s = unsafe { DmaSlice::new(&a, Iova(0x1000), 4096, dir) };
            assert_eq!(s.dir(), dir);
            assert_eq!(s.check_dir(false).is_ok(), reads, "{dir:?}");
            assert_eq!(s.check_dir(true).is_ok(), writes, "{dir:?}");
            if !reads {
                assert_eq!(s.check_dir(false), Err(dir));
            }
            assert!(s.is_mapped_in(&a) && !s.is_mapped_in(&b));
            assert_eq!(
                (s.iova(), s.len(), s.total_len()),
                (Iova(0x1000), 4096, 4096)
            );
            assert!(format!("{s:?}").contains(&format!("{dir:?}")));
        }
    }

    /// The one-compare check a queue's hot path makes answers exactly as
    /// the direction's check and the space's check together, for every
    /// direction, both kinds of command and a slice of another space.
    #[test]
    fn a_dma_slice_is_usable_exactly_when_both_checks_pass() {
        let space = || {
            let iommu = mcqio_fixtures::FakeIommu::new(Default::default());
            DmaSpace::new(Arc::new(iommu), mcqio_vfio::HugePages::Never)
        };
        let spaces = [space(), space(), space()];
        for dir in [DmaDir::ToDevice, DmaDir::FromDevice, DmaDir::Bidirectional] {
            for made_in in &spaces {
                // SAFETY: the slice is only inspected, never given to a device.
                let s = unsafe { DmaSlice::new(made_in, Iova(0x2000), 512, dir) };
                for queue in &spaces {
                    let key = DmaSlice::space_key(queue);
                    for device_writes in [false, true] {
                        let both = s.check_dir(device_writes).is_ok() && s.is_mapped_in(queue);
                        assert_eq!(
                            s.usable_in(queue, key, device_writes),
                            both,
                            "{dir:?}, same space {}, device writes {device_writes}",
                            std::ptr::eq(made_in, queue)
                        );
                    }
                }
            }
        }
    }
}
