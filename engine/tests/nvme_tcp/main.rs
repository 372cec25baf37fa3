//! The engine over NVMe/TCP (`mcqio::nvme::tcp`), against the fake target
//! of `mcqio-fixtures` (`mcqio_fixtures::tcp`) on loopback: bring-up and
//! discovery, size classes and digests, faults the target commits reaching
//! the application as typed errors, a target that lies, and waiting on the
//! socket (the tokio driver with `--features tokio`, in `wait::on_tokio`).
//!
//! What holds on every wire alike is tested once in `wire_neutral/`; the
//! fake target's own tests stay in `fixtures/tests/`.

mod initiator;
mod trust;
mod wait;
