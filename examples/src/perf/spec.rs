//! The command line's small languages (device strings, sizes, durations, CPU
//! lists): the parser every frontend shares, `mcqio_open::devstr`.

pub use mcqio_open::devstr::*;
