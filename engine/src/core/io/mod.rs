//! The I/O API's data types: DMA buffers, completions and typed errors.
//!
//! # Buffer ownership
//!
//! A submission *moves* its buffer into the command's tracker; the buffer
//! comes back in the [`Completion`] (or in the [`SubmitError`] if the command
//! was rejected). While the device may access the memory nobody else can
//! touch it, and nothing is cloned or reference-counted per I/O.
//!
//! Any type can carry data if it implements [`IoBuf`]: [`DmaBuf`] (memory
//! from a [`DmaSpace`](mcqio_vfio::DmaSpace)), `Vec<DmaBuf>` (vectored: several buffers, one PRP
//! list), or a buffer that some other layer mapped (a pool, a strict or lazy
//! mapping) and describes by IOVA + length.
//!
//! # PRP rules enforced at submission
//!
//! The first segment may start at any 4-byte aligned IOVA; every later
//! segment must start on a 4 KiB page boundary, and every segment but the
//! last must end on one. A buffer breaking these rules is rejected with
//! [`SubmitErrorKind::Misaligned`].

//!
//! Two files: `buf.rs`, the buffers ([`IoBuf`], [`DmaBuf`], [`DmaSlice`],
//! [`IoSeg`]); `completion.rs`, how a command ends ([`Completion`],
//! [`IoError`]) or is refused ([`SubmitError`]).

mod buf;
mod completion;

pub use self::buf::{DmaBuf, DmaSlice, IoBuf, IoSeg, DMA_BUF_MAX_REGION};
pub use self::completion::{Completion, IoError, SubmitError, SubmitErrorKind};
