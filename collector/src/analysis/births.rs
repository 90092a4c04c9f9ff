//! Live allocations by birth epoch ("generations"): what a leak is measured in. One per
//! (site, device) in the leak detector, one per device in the device-growth detector.
//!
//! O(1) per event, bounded memory: at most [`MAX_GENERATIONS`] buckets; beyond, the two oldest
//! merge (a long leak must not grow memory), remembering how many epochs they hold.

use std::collections::VecDeque;

/// Birth-epoch buckets kept; older ones merge.
pub const MAX_GENERATIONS: usize = 64;

#[derive(Clone, Copy, Debug, Default)]
struct Generation {
    /// The epoch it starts at (a merged bucket: its oldest).
    epoch: u32,
    count: u32,
    bytes: u64,
    /// Epochs merged into this bucket (1 unless old buckets were coarsened).
    epochs: u32,
}

/// Live allocations by the epoch they were born in: buckets in epoch order. A deque, not a
/// tree: allocations are born in the current epoch (the newest bucket, or a new one at the
/// back) and most die young (the newest buckets), so both ends are where the work is, and
/// an epoch every few events (a tight loop found as the iteration) must cost no tree node.
#[derive(Clone, Debug, Default)]
pub struct Births {
    by_epoch: VecDeque<Generation>,
}

impl Births {
    /// The index of the bucket holding `epoch` (the last starting at or before it), if any.
    fn bucket_of(&self, epoch: u32) -> Option<usize> {
        // Births die young: look at the newest bucket before bisecting.
        match self.by_epoch.back() {
            Some(g) if g.epoch <= epoch => Some(self.by_epoch.len() - 1),
            _ => self
                .by_epoch
                .partition_point(|g| g.epoch <= epoch)
                .checked_sub(1),
        }
    }

    /// The first bucket starting at or after `epoch`.
    fn first_from(&self, epoch: u32) -> usize {
        self.by_epoch.partition_point(|g| g.epoch < epoch)
    }

    /// The buckets starting in `from..=upto`.
    fn range(&self, from: u32, upto: u32) -> impl Iterator<Item = &Generation> {
        self.by_epoch
            .range(self.first_from(from)..)
            .take_while(move |g| g.epoch <= upto)
    }

    /// An allocation of `size` born in `epoch`.
    pub fn add(&mut self, epoch: u32, size: u64) {
        let i = match self.by_epoch.back() {
            Some(g) if g.epoch == epoch => self.by_epoch.len() - 1,
            Some(g) if g.epoch > epoch => {
                // Not the newest epoch (never from the clock, which only moves forward): its
                // own bucket, in order.
                let i = self.first_from(epoch);
                if self.by_epoch.get(i).is_none_or(|g| g.epoch != epoch) {
                    self.by_epoch.insert(i, Generation::new(epoch));
                }
                i
            }
            _ => {
                self.by_epoch.push_back(Generation::new(epoch));
                self.by_epoch.len() - 1
            }
        };
        let g = &mut self.by_epoch[i];
        g.count += 1;
        g.bytes = g.bytes.saturating_add(size);
        self.coarsen();
    }

    /// A free of an allocation of `size` born in `birth`.
    pub fn remove(&mut self, birth: u32, size: u64) {
        // The bucket holding `birth` (a merged bucket starts at or before it).
        if let Some(i) = self.bucket_of(birth) {
            let g = &mut self.by_epoch[i];
            g.count = g.count.saturating_sub(1);
            g.bytes = g.bytes.saturating_sub(size);
            if g.count == 0 {
                // Most die in the newest bucket (or the oldest): an end of the deque, popped
                // without `remove`'s general shuffle.
                if i + 1 == self.by_epoch.len() {
                    self.by_epoch.pop_back();
                } else if i == 0 {
                    self.by_epoch.pop_front();
                } else {
                    self.by_epoch.remove(i);
                }
            }
        }
    }

    /// Distinct birth epochs in `from..=upto` among live allocations.
    pub fn generations(&self, from: u32, upto: u32) -> u32 {
        if upto < from || self.by_epoch.is_empty() {
            return 0;
        }
        self.range(from, upto).map(|g| g.epochs.min(g.count)).sum()
    }

    /// Live bytes and allocations born in `from..=upto`.
    pub fn born_between(&self, from: u32, upto: u32) -> (u64, u64) {
        if upto < from {
            return (0, 0);
        }
        self.range(from, upto).fold((0u64, 0u64), |(b, c), g| {
            (b.saturating_add(g.bytes), c + u64::from(g.count))
        })
    }

    /// The oldest birth epoch with a live allocation.
    pub fn oldest(&self) -> Option<u32> {
        self.by_epoch.front().map(|g| g.epoch)
    }

    /// The oldest birth epoch at or after `from` with a live allocation.
    pub fn oldest_from(&self, from: u32) -> Option<u32> {
        self.by_epoch.get(self.first_from(from)).map(|g| g.epoch)
    }

    /// The live allocations born in each epoch of `from..=upto`: what [`ByStep::lockstep`]
    /// compares (one entry per bucket; a merged bucket's entry counts all its epochs).
    pub fn by_step(&self, at: u32, from: u32, upto: u32) -> ByStep {
        if upto < from {
            return ByStep {
                at,
                steps: Vec::new(),
            };
        }
        ByStep {
            at,
            steps: self
                .range(from, upto)
                .map(|g| (g.epoch, g.epochs, g.count))
                .collect(),
        }
    }

    /// Buckets kept (at most [`MAX_GENERATIONS`]).
    pub fn buckets(&self) -> usize {
        self.by_epoch.len()
    }

    fn coarsen(&mut self) {
        while self.by_epoch.len() > MAX_GENERATIONS {
            let (Some(older), Some(newer)) = (self.by_epoch.pop_front(), self.by_epoch.pop_front())
            else {
                return;
            };
            self.by_epoch.push_front(Generation {
                epoch: older.epoch,
                count: older.count.saturating_add(newer.count),
                bytes: older.bytes.saturating_add(newer.bytes),
                epochs: older.epochs + newer.epochs,
            });
        }
    }
}

/// A series' live allocations by the step they were born in, read at one step boundary:
/// `(epoch, epochs merged, allocations)` in epoch order. Two series whose memory is kept by
/// one object (an output with its autograd graph) have the same steps, in the same
/// proportions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ByStep {
    /// The step boundary it was read at.
    pub at: u32,
    pub steps: Vec<(u32, u32, u32)>,
}

impl ByStep {
    /// Fewest steps two series must share to be in lockstep.
    pub const MIN_STEPS: usize = 3;

    /// Whether `self` and `other`, read at the same boundary, hold allocations born in exactly
    /// the same steps (at least [`Self::MIN_STEPS`]), in the same proportion at every step
    /// (`a` allocations here for each `b` there, the same `a : b` each step).
    pub fn lockstep(&self, other: &ByStep) -> bool {
        if self.at != other.at
            || self.steps.len() != other.steps.len()
            || self.steps.len() < Self::MIN_STEPS
        {
            return false;
        }
        let (a0, b0) = (self.steps[0].2, other.steps[0].2);
        self.steps.iter().zip(&other.steps).all(|(a, b)| {
            a.0 == b.0
                && a.1 == b.1
                && u64::from(a.2) * u64::from(b0) == u64::from(b.2) * u64::from(a0)
        })
    }

    /// Allocations per step, on average over its steps.
    pub fn per_step(&self) -> f64 {
        let epochs: u32 = self.steps.iter().map(|s| s.1).sum();
        let count: u64 = self.steps.iter().map(|s| u64::from(s.2)).sum();
        if epochs == 0 {
            0.0
        } else {
            count as f64 / f64::from(epochs)
        }
    }
}

impl Generation {
    fn new(epoch: u32) -> Generation {
        Generation {
            epoch,
            epochs: 1,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The tree this deque replaced, as it was: the reference every answer must match.
    #[derive(Default)]
    struct Reference(BTreeMap<u32, (u32, u64, u32)>);

    impl Reference {
        fn add(&mut self, epoch: u32, size: u64) {
            let g = self.0.entry(epoch).or_insert((0, 0, 1));
            g.0 += 1;
            g.1 += size;
            while self.0.len() > MAX_GENERATIONS {
                let mut it = self.0.keys();
                let (a, b) = (*it.next().unwrap(), *it.next().unwrap());
                let (o, n) = (self.0.remove(&a).unwrap(), self.0.remove(&b).unwrap());
                self.0.insert(a, (o.0 + n.0, o.1 + n.1, o.2 + n.2));
            }
        }
        fn remove(&mut self, birth: u32, size: u64) {
            if let Some((&k, g)) = self.0.range_mut(..=birth).next_back() {
                g.0 = g.0.saturating_sub(1);
                g.1 = g.1.saturating_sub(size);
                if g.0 == 0 {
                    self.0.remove(&k);
                }
            }
        }
        fn generations(&self, from: u32, upto: u32) -> u32 {
            self.0.range(from..=upto).map(|(_, g)| g.2.min(g.0)).sum()
        }
    }

    /// Random births and deaths, mostly young, some out of order: the same buckets and
    /// answers as the tree.
    #[test]
    fn the_deque_answers_as_the_tree_did() {
        let mut b = Births::default();
        let mut r = Reference::default();
        let mut live: Vec<(u32, u64)> = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut epoch = 0u32;
        for _ in 0..200_000 {
            let roll = next() % 100;
            if roll < 3 {
                epoch += 1 + (next() % 3) as u32;
            } else if roll < 50 || live.is_empty() {
                let e = if next() % 50 == 0 {
                    epoch.saturating_sub((next() % 200) as u32)
                } else {
                    epoch
                };
                let size = 1 + next() % 4096;
                b.add(e, size);
                r.add(e, size);
                live.push((e, size));
            } else {
                let n = live.len();
                let i = if next() % 4 == 0 {
                    (next() as usize) % n
                } else {
                    n - 1
                };
                let (e, size) = live.swap_remove(i);
                b.remove(e, size);
                r.remove(e, size);
            }
            if next() % 64 == 0 {
                let from = epoch.saturating_sub((next() % 300) as u32);
                assert_eq!(b.generations(from, epoch), r.generations(from, epoch));
                assert_eq!(b.buckets(), r.0.len());
                assert_eq!(b.oldest(), r.0.keys().next().copied());
                let born =
                    r.0.range(from..=epoch)
                        .fold((0, 0), |(by, c), (_, g)| (by + g.1, c + u64::from(g.0)));
                assert_eq!(b.born_between(from, epoch), born);
            }
        }
    }

    /// Series kept by one object are in lockstep: the same steps, in proportion; a series that
    /// began later, skipped a step or kept a different number at one step is not.
    #[test]
    fn lockstep_is_the_same_steps_in_the_same_proportion() {
        let series = |counts: &[(u32, u32)]| {
            let mut b = Births::default();
            for &(e, n) in counts {
                for _ in 0..n {
                    b.add(e, 8);
                }
            }
            b.by_step(20, 4, 18)
        };
        let one: Vec<(u32, u32)> = (0..20).map(|e| (e, 1)).collect();
        let two: Vec<(u32, u32)> = (0..20).map(|e| (e, 2)).collect();
        assert!(series(&one).lockstep(&series(&two)));
        assert_eq!(series(&two).per_step(), 2.0);
        let later: Vec<(u32, u32)> = (8..20).map(|e| (e, 1)).collect();
        assert!(!series(&one).lockstep(&series(&later)));
        let mut skipped = one.clone();
        skipped.remove(10);
        assert!(!series(&one).lockstep(&series(&skipped)));
        let mut uneven = two.clone();
        uneven[12].1 = 3;
        assert!(!series(&one).lockstep(&series(&uneven)));
        // Too few steps to say.
        let few: Vec<(u32, u32)> = (17..20).map(|e| (e, 1)).collect();
        assert!(!series(&few).lockstep(&series(&few)));
    }

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
