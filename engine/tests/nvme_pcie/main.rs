//! The engine over NVMe on PCIe (`mcqio::nvme::pcie`), against the fake
//! controller of `mcqio-fixtures` (`mcqio_fixtures::nvme`): bring-up and
//! Identify, I/O and PRP lists, DMA mappings and page sizes, the wire
//! formats, recovery, timeouts and errors, a hostile device, and the
//! seeded soak (ignored here; `.ci/run` runs it with `--ignored`).
//!
//! What holds on every wire alike is tested once in `wire_neutral/`.

mod app_buffers;
mod errors;
mod exactly_once;
mod fuzz;
mod hostile;
mod identify;
mod io;
mod mapping;
mod mcq;
mod page_size;
mod prp_prop;
mod recovery;
mod soak;
mod spec;
mod split;
mod trust_ctrl;
mod trust_queue;
