//! mcqio-perf (skeleton)
fn main() {}
