//! Live allocations by birth epoch ("generations"): what a leak is measured in. One per
//! (site, device) in the leak detector, one per device in the device-growth detector.
//!
//! O(1) per event, bounded memory: at most [`MAX_GENERATIONS`] buckets; beyond, the two oldest
//! merge (a long leak must not grow memory), remembering how many epochs they hold.

use std::collections::BTreeMap;

/// Birth-epoch buckets kept; older ones merge.
pub const MAX_GENERATIONS: usize = 64;

#[derive(Clone, Copy, Debug, Default)]
struct Generation {
    count: u32,
    bytes: u64,
    /// Epochs merged into this bucket (1 unless old buckets were coarsened).
    epochs: u32,
}

/// Live allocations by the epoch they were born in.
#[derive(Clone, Debug, Default)]
pub struct Births {
    by_epoch: BTreeMap<u32, Generation>,
}

impl Births {
    /// An allocation of `size` born in `epoch`.
    pub fn add(&mut self, epoch: u32, size: u64) {
        let g = self.by_epoch.entry(epoch).or_insert(Generation {
            epochs: 1,
            ..Default::default()
        });
        g.count += 1;
        g.bytes = g.bytes.saturating_add(size);
        self.coarsen();
    }

    /// A free of an allocation of `size` born in `birth`.
    pub fn remove(&mut self, birth: u32, size: u64) {
        // The bucket holding `birth` (a merged bucket starts at or before it).
        if let Some((&k, g)) = self.by_epoch.range_mut(..=birth).next_back() {
            g.count = g.count.saturating_sub(1);
            g.bytes = g.bytes.saturating_sub(size);
            if g.count == 0 {
                self.by_epoch.remove(&k);
            }
        }
    }

    /// Distinct birth epochs in `from..=upto` among live allocations.
    pub fn generations(&self, from: u32, upto: u32) -> u32 {
        if upto < from {
            return 0;
        }
        self.by_epoch
            .range(from..=upto)
            .map(|(_, g)| g.epochs.min(g.count))
            .sum()
    }

    /// Live bytes and allocations born in `from..=upto`.
    pub fn born_between(&self, from: u32, upto: u32) -> (u64, u64) {
        if upto < from {
            return (0, 0);
        }
        self.by_epoch
            .range(from..=upto)
            .fold((0u64, 0u64), |(b, c), (_, g)| {
                (b.saturating_add(g.bytes), c + u64::from(g.count))
            })
    }

    /// The oldest birth epoch with a live allocation.
    pub fn oldest(&self) -> Option<u32> {
        self.by_epoch.keys().next().copied()
    }

    /// The oldest birth epoch at or after `from` with a live allocation.
    pub fn oldest_from(&self, from: u32) -> Option<u32> {
        self.by_epoch.range(from..).next().map(|(&k, _)| k)
    }

    /// Buckets kept (at most [`MAX_GENERATIONS`]).
    pub fn buckets(&self) -> usize {
        self.by_epoch.len()
    }

    fn coarsen(&mut self) {
        while self.by_epoch.len() > MAX_GENERATIONS {
            let mut it = self.by_epoch.keys();
            let (Some(&a), Some(&b)) = (it.next(), it.next()) else {
                return;
            };
            let older = self.by_epoch.remove(&a).unwrap_or_default();
            let newer = self.by_epoch.remove(&b).unwrap_or_default();
            self.by_epoch.insert(
                a,
                Generation {
                    count: older.count.saturating_add(newer.count),
                    bytes: older.bytes.saturating_add(newer.bytes),
                    epochs: older.epochs + newer.epochs,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_count_distinct_live_epochs_and_stay_bounded() {
        let mut b = Births::default();
        for e in 0..200 {
            b.add(e, 10);
        }
        assert_eq!(b.buckets(), MAX_GENERATIONS);
        assert_eq!(b.generations(0, 199), 200);
        assert_eq!(b.born_between(190, 199), (100, 10));
        b.remove(199, 10);
        assert_eq!(b.generations(199, 199), 0);
        b.remove(0, 10);
        assert_eq!(
            b.oldest(),
            Some(0),
            "a merged bucket starts at its oldest epoch"
        );
        assert_eq!(b.oldest_from(150), Some(150));
    }
}
