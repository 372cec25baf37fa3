//! The engine's async driver (`mcqio::core::asyncio`, `AsyncQueue`) over
//! the fakes: the executor-agnostic futures, their allocation-free path,
//! adversarial executors, a lying device, and the tokio driver (with
//! `--features tokio`, in `on_tokio`).

mod adversarial;
mod alloc;
#[cfg(feature = "tokio")]
mod on_tokio;
mod queue;
mod trust;
