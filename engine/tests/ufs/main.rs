//! The engine over UFS (`mcqio::ufs`), against the fake UFS host
//! controller and device of `mcqio-fixtures` (`mcqio_fixtures::ufs`):
//! bring-up, I/O on MCQ and the legacy doorbell, SCSI sense and faults,
//! resets and timeouts, HPB, a hostile device, and the seeded soak
//! (ignored here; `.ci/run` runs it with `--ignored`).
//!
//! What holds on every wire alike is tested once in `wire_neutral/`.

mod bringup;
mod faults;
mod hostile;
mod hostile_seeded;
mod hpb;
mod hpb_trust;
mod io;
mod reset;
mod soak;
mod timeouts;
mod trust;
