//! DMA mapping modes benchmark (filled in below).
fn main() {}
