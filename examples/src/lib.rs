//! Code the example programs share (`mcqio-perf`, `hello`, `identify`): the
//! device-string parser and its defaults, so every program understands the
//! same `fake,ns=2,lbs=4k` and builds the same device from it.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod devstr;
