//! What the engine's shared core (`mcqio::core`) promises on every wire,
//! tested once over the fakes: the lifecycle suite (exactly-once delivery,
//! recovery, timeouts, close and a short soak over the NVMe PCIe fake, the
//! UFS fake and the NVMe/TCP fake target, from one table), code written
//! once against `BlockQueue`, the tracker's generation wrap, DMA mapping
//! faults, and the small API conveniences.

mod api;
mod block_queue;
mod lifecycle;
mod mapping_faults;
mod wrap;
