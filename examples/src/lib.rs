//! Code the example programs share. The device-string language and the
//! opener are the `mcqio-open` crate's (shared with the fio engine); its
//! parser is re-exported here under its old path.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub use mcqio_open::devstr;
