//! Ring index arithmetic shared by every wire's queues.

/// The index after `i` in a ring of `entries` slots (`u16` or `u32`).
#[inline(always)]
pub(crate) fn next<T>(i: T, entries: T) -> T
where
    T: Copy + PartialEq + From<u8> + std::ops::Add<Output = T>,
{
    let j = i + T::from(1);
    if j == entries {
        T::from(0)
    } else {
        j
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn next_wraps_at_the_ring_size() {
        assert_eq!(super::next(0u16, 4), 1);
        assert_eq!(super::next(3u16, 4), 0);
        assert_eq!(super::next(0u32, 1), 0);
    }
}
