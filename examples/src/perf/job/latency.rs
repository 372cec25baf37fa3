//! A direction's latency sum, minimum and maximum, kept in clock ticks on
//! the completion path and converted to ns once per run.

/// A direction's latency sum, min and max, in clock ticks, and its I/O
/// count. The count is the direction's `ios` and, with the other
/// direction's, the job's: one increment per I/O instead of two.
/// It is kept apart from `sum`: side by side, the two additions were
/// merged into one vector addition that took three more instructions.
///
/// The extremes are kept as the minimum `lo` and the width `span` of the
/// range seen, so a latency outside it is found with one subtraction and
/// one compare (`ticks - lo > span`, unsigned: below `lo` wraps to a large
/// value), where testing the minimum and the maximum apart took two
/// compares, two jumps and the entry's address.
#[derive(Clone, Copy, Debug)]
pub(super) struct LatTicks {
    pub(super) sum: u64,
    pub(super) lo: u64,
    pub(super) span: u64,
    pub(super) n: u64,
}

impl LatTicks {
    /// No latency yet: any but `u64::MAX` ticks is outside the range, and
    /// the first one sets it (`extreme`); `n` says whether there is any.
    pub(super) const EMPTY: LatTicks = LatTicks {
        sum: 0,
        lo: u64::MAX,
        span: 0,
        n: 0,
    };

    /// Count one latency of `ticks`.
    #[inline(always)]
    pub(super) fn add(lats: &mut [LatTicks; 2], d: usize, ticks: u64) {
        let lat = &mut lats[d];
        lat.n += 1;
        lat.sum = lat.sum.wrapping_add(ticks);
        // A new extreme is rare: a compare and an untaken jump, the
        // stores in a cold call (inline, their address was computed on
        // every completion).
        if ticks.wrapping_sub(lat.lo) > lat.span {
            LatTicks::extreme(lats, d, ticks);
        }
    }

    /// `ticks` is a new minimum or maximum of direction `d`, or its first
    /// latency. Given the array and the index: given the entry, the caller
    /// computed its address on every completion.
    #[cold]
    #[inline(never)]
    fn extreme(lats: &mut [LatTicks; 2], d: usize, ticks: u64) {
        let lat = &mut lats[d];
        // `n` was counted first: 1 for the first latency.
        let (min, max) = if lat.n == 1 {
            (ticks, ticks)
        } else {
            (lat.min().min(ticks), lat.max().max(ticks))
        };
        lat.lo = min;
        lat.span = max - min;
    }

    /// The smallest latency (meaningful when `n > 0`).
    pub(super) fn min(&self) -> u64 {
        self.lo
    }

    /// The largest latency (meaningful when `n > 0`).
    pub(super) fn max(&self) -> u64 {
        self.lo.wrapping_add(self.span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The latency range kept as its minimum and width gives the true
    /// minimum and maximum of any sequence, per direction: first latency
    /// 0, equal latencies, new extremes on both sides, and the largest
    /// value (against a min/max computed directly).
    #[test]
    fn latency_extremes_are_the_true_minimum_and_maximum() {
        let seqs: [&[u64]; 6] = [
            &[0],
            &[5, 5, 5],
            &[7, 3, 9, 1, 12, 12, 0],
            &[100, 200, 150, 50, 250],
            &[u64::MAX - 1, 3, u64::MAX - 1],
            &[1, u64::MAX - 1, 0],
        ];
        for seq in seqs {
            let mut lats = [LatTicks::EMPTY; 2];
            for (i, &t) in seq.iter().enumerate() {
                LatTicks::add(&mut lats, 1, t);
                let seen = &seq[..=i];
                let l = lats[1];
                assert_eq!(l.n, i as u64 + 1);
                assert_eq!(l.min(), *seen.iter().min().unwrap(), "{seq:?} after {i}");
                assert_eq!(l.max(), *seen.iter().max().unwrap(), "{seq:?} after {i}");
            }
            // The other direction saw nothing.
            assert_eq!(lats[0].n, 0);
            assert_eq!(lats[0].sum, 0);
        }
    }
}
