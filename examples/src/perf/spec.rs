//! The command line's small languages (device strings, sizes, durations, CPU
//! lists): the parser every example program shares, `mcqio_examples::devstr`.

pub use mcqio_examples::devstr::*;
