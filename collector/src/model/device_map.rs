//! `DeviceMap`: something per device ordinal, looked up on every event.
//!
//! A process has one to a few dozen devices, and every allocation and free looks its device
//! up several times (the model's totals, the anatomy's clock, the fit's timeline): a
//! `BTreeMap<i16, _>` cost some 50 instructions a lookup, a fifth of the model's work on a
//! cudaMalloc+cudaFree pair (bench/2026-12-06-collector.md). Here the entries are kept in
//! device order in two vectors, as a sorted map iterates them, and a device ordinal a
//! process can have ([`plausible_device`]: host or unknown, then 0 to `MAX_DEVICES - 1`) finds
//! its entry through a fixed table indexed by the ordinal. Any other `i16` still works (a
//! binary search): the type is total, and only the model's plausibility rule keeps such
//! devices out.
//!
//! It answers what the call sites asked of the `BTreeMap` it replaced, with the same
//! signatures (`get(&device)`, `entry(device).or_default()`, `map[&device]`, iteration in
//! device order), so that a change of map was a change of type only.

use std::fmt;
use std::ops::Index;

use oomtrace_proto::{plausible_device, DEVICE_UNKNOWN, MAX_DEVICES};

/// Plausible ordinals, `DEVICE_UNKNOWN..MAX_DEVICES`, each a slot of the direct table.
const SLOTS: usize = (MAX_DEVICES - DEVICE_UNKNOWN) as usize;

/// Values by device ordinal, iterated in ordinal order (see the module doc).
#[derive(Clone)]
pub struct DeviceMap<V> {
    /// Ordinals, ascending; `values[i]` belongs to `keys[i]`.
    keys: Vec<i16>,
    values: Vec<V>,
    /// For a plausible ordinal `d`, at `d - DEVICE_UNKNOWN`: its index in `keys` plus one, or
    /// 0 when absent (u16: the implausible ordinals before a plausible one can be thousands).
    slot: [u16; SLOTS],
}

impl<V> Default for DeviceMap<V> {
    fn default() -> Self {
        DeviceMap {
            keys: Vec::new(),
            values: Vec::new(),
            slot: [0; SLOTS],
        }
    }
}

impl<V> DeviceMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    fn index_of(&self, device: i16) -> Option<usize> {
        if plausible_device(device) {
            let at = self.slot[(device - DEVICE_UNKNOWN) as usize];
            (at != 0).then(|| usize::from(at) - 1)
        } else {
            self.keys.binary_search(&device).ok()
        }
    }

    #[inline]
    pub fn get(&self, device: &i16) -> Option<&V> {
        self.index_of(*device).map(|i| &self.values[i])
    }

    #[inline]
    pub fn get_mut(&mut self, device: &i16) -> Option<&mut V> {
        self.index_of(*device).map(|i| &mut self.values[i])
    }

    pub fn contains_key(&self, device: &i16) -> bool {
        self.index_of(*device).is_some()
    }

    /// The entry of `device`, to fill when absent.
    #[inline]
    pub fn entry(&mut self, device: i16) -> Entry<'_, V> {
        Entry { map: self, device }
    }

    /// Sets `device`'s value; returns the one it replaced.
    pub fn insert(&mut self, device: i16, value: V) -> Option<V> {
        match self.index_of(device) {
            Some(i) => Some(std::mem::replace(&mut self.values[i], value)),
            None => {
                self.add(device, value);
                None
            }
        }
    }

    /// A new device's entry in its place; the index of every entry after it moves by one.
    #[cold]
    fn add(&mut self, device: i16, value: V) -> usize {
        let at = self.keys.partition_point(|&k| k < device);
        self.keys.insert(at, device);
        self.values.insert(at, value);
        for (i, &k) in self.keys.iter().enumerate().skip(at) {
            if plausible_device(k) {
                // Fits: only keys below `k` come before it, and below the largest plausible
                // ordinal there are fewer than 32,768 + 64 of them.
                self.slot[(k - DEVICE_UNKNOWN) as usize] = (i + 1) as u16;
            }
        }
        at
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// (device, value) in device order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&i16, &V)> + ExactSizeIterator {
        self.keys.iter().zip(self.values.iter())
    }

    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&i16, &mut V)> + ExactSizeIterator {
        self.keys.iter().zip(self.values.iter_mut())
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &i16> + ExactSizeIterator {
        self.keys.iter()
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.values.iter()
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.values.iter_mut()
    }
}

/// A device's place in a [`DeviceMap`], as `BTreeMap::entry` gives one.
pub struct Entry<'a, V> {
    map: &'a mut DeviceMap<V>,
    device: i16,
}

impl<'a, V> Entry<'a, V> {
    // Always: the model looks a device up this way three times an allocation, and out of
    // line each cost a call (18 instructions a time, callgrind).
    #[inline(always)]
    pub fn or_insert_with(self, make: impl FnOnce() -> V) -> &'a mut V {
        let i = match self.map.index_of(self.device) {
            Some(i) => i,
            None => self.map.add(self.device, make()),
        };
        &mut self.map.values[i]
    }

    #[inline(always)]
    pub fn or_default(self) -> &'a mut V
    where
        V: Default,
    {
        self.or_insert_with(V::default)
    }
}

impl<V> Index<&i16> for DeviceMap<V> {
    type Output = V;

    /// Panics when `device` has no entry, as a map's index does.
    fn index(&self, device: &i16) -> &V {
        self.get(device)
            .unwrap_or_else(|| panic!("no entry for device {device}"))
    }
}

impl<'a, V> IntoIterator for &'a DeviceMap<V> {
    type Item = (&'a i16, &'a V);
    type IntoIter = std::iter::Zip<std::slice::Iter<'a, i16>, std::slice::Iter<'a, V>>;

    fn into_iter(self) -> Self::IntoIter {
        self.keys.iter().zip(self.values.iter())
    }
}

impl<'a, V> IntoIterator for &'a mut DeviceMap<V> {
    type Item = (&'a i16, &'a mut V);
    type IntoIter = std::iter::Zip<std::slice::Iter<'a, i16>, std::slice::IterMut<'a, V>>;

    fn into_iter(self) -> Self::IntoIter {
        self.keys.iter().zip(self.values.iter_mut())
    }
}

impl<V: fmt::Debug> fmt::Debug for DeviceMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V: PartialEq> PartialEq for DeviceMap<V> {
    fn eq(&self, other: &Self) -> bool {
        self.keys == other.keys && self.values == other.values
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The map answers as a `BTreeMap<i16, _>` fed the same inserts: every plausible ordinal,
    /// the implausible extremes, in an order that puts new entries before, between and after
    /// the old ones.
    #[test]
    fn it_answers_as_a_sorted_map_for_every_ordinal() {
        let mut ours: DeviceMap<u64> = DeviceMap::new();
        let mut theirs: BTreeMap<i16, u64> = BTreeMap::new();
        let mut order: Vec<i16> = vec![3, -1, 63, 0, i16::MIN, 64, i16::MAX, -2, 7, 1, 62];
        order.extend(-5..70);
        for (n, &d) in order.iter().enumerate() {
            let value = n as u64;
            if n % 3 == 0 {
                assert_eq!(ours.insert(d, value), theirs.insert(d, value), "insert {d}");
            } else {
                *ours.entry(d).or_default() += value;
                *theirs.entry(d).or_default() += value;
            }
            assert_eq!(ours.len(), theirs.len());
            for probe in [i16::MIN, -3, -2, -1, 0, 1, 3, 7, 62, 63, 64, 65, i16::MAX] {
                assert_eq!(
                    ours.get(&probe),
                    theirs.get(&probe),
                    "get {probe} after {d}"
                );
                assert_eq!(ours.contains_key(&probe), theirs.contains_key(&probe));
            }
            assert!(ours.iter().eq(theirs.iter()), "order after {d}");
        }
        for (_, v) in &mut ours {
            *v += 1;
        }
        for v in theirs.values_mut() {
            *v += 1;
        }
        assert!(ours.iter().eq(theirs.iter()));
        assert!(ours.keys().rev().eq(theirs.keys().rev()));
        assert_eq!(ours[&63], theirs[&63]);
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
    }

    #[test]
    fn an_absent_device_reads_as_absent_and_its_index_panics() {
        let mut m: DeviceMap<u8> = DeviceMap::default();
        assert!(m.is_empty() && m.get(&0).is_none() && m.get_mut(&-1).is_none());
        *m.entry(0).or_insert_with(|| 4) += 1;
        assert_eq!(m.get(&0), Some(&5));
        assert!(m.get(&1).is_none() && m.get(&300).is_none());
        let r = std::panic::catch_unwind(|| m[&1]);
        assert!(r.is_err());
    }
}
