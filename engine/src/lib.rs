//! # mcqio: a user-space polled NVMe engine
//!
//! (skeleton; the engine lands here)
