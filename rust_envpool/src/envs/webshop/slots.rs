//! [`Slots`]: what a shop keeps of its recent work (goals started, rewards of purchases, the
//! Python objects of a reset), shared by its envs. A group of envs plays the same goal at about
//! the same time, so keeping the last few thousand keys catches nearly every repeat, at a fixed
//! cost in memory and one bit of bookkeeping per set of two.

use std::sync::{Mutex, MutexGuard};

/// Where a key goes.
#[derive(Clone, Copy, Debug)]
pub enum Placement {
    /// Set `key % sets`: consecutive keys (goal indices) never share a set within `sets`.
    Direct,
    /// A multiplicative hash of the whole key: for keys made of two parts (goal, product).
    Hashed,
}

/// A two-way set-associative cache of values by `u64` key: key `k` belongs to one set of two
/// slots, and a new key takes over the slot of its set used least recently (kept or read).
/// One lock guards all slots; callers make values outside it, and a value pushed out is dropped
/// after the lock is released (dropping Python objects can run Python code).
#[derive(Debug)]
pub struct Slots<V> {
    sets: Mutex<Vec<Set<V>>>,
    placement: Placement,
}

/// Two slots and which of them goes first.
#[derive(Debug)]
struct Set<V> {
    ways: [Option<(u64, V)>; 2],
    /// The way a new key takes (the one used least recently).
    victim: usize,
}

impl<V> Slots<V> {
    /// Room for `n` keys (`n` even, `n >= 2`): `n / 2` sets of two.
    pub fn new(n: usize, placement: Placement) -> Slots<V> {
        assert!(
            n >= 2 && n.is_multiple_of(2),
            "Slots::new: n must be even and >= 2, got {n}"
        );
        Slots {
            sets: Mutex::new(
                (0..n / 2)
                    .map(|_| Set {
                        ways: [None, None],
                        victim: 0,
                    })
                    .collect(),
            ),
            placement,
        }
    }

    /// The set of `key` among `sets`.
    pub fn set_of(&self, key: u64, sets: usize) -> usize {
        match self.placement {
            Placement::Direct => (key % sets as u64) as usize,
            // the product's high bits, scaled to [0, sets)
            Placement::Hashed => ((key.wrapping_mul(0x9E37_79B9_7F4A_7C15) as u128 * sets as u128) >> 64) as usize,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Set<V>>> {
        // a panic while holding the lock leaves whole values behind: the slots stay usable
        self.sets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` of the value kept for `key` (under the lock: keep `f` short), None when not kept.
    pub fn with<R>(&self, key: u64, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut sets = self.lock();
        let n = sets.len();
        let set = &mut sets[self.set_of(key, n)];
        let w = set.ways.iter().position(|x| matches!(x, Some((k, _)) if *k == key))?;
        set.victim = 1 - w;
        set.ways[w].as_mut().map(|(_, v)| f(v))
    }

    /// Keeps `value` for `key`, in place of its old value or of its set's least recent key.
    pub fn put(&self, key: u64, value: V) {
        let old = {
            let mut sets = self.lock();
            let n = sets.len();
            let set = &mut sets[self.set_of(key, n)];
            let w = set
                .ways
                .iter()
                .position(|x| matches!(x, Some((k, _)) if *k == key))
                .or_else(|| set.ways.iter().position(Option::is_none))
                .unwrap_or(set.victim);
            set.victim = 1 - w;
            set.ways[w].replace((key, value))
        };
        drop(old);
    }
}

impl<V: Clone> Slots<V> {
    /// A clone of the value kept for `key`.
    pub fn get(&self, key: u64) -> Option<V> {
        self.with(key, |v| v.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// The plain model: per set, its keys most recent first (at most two).
    #[derive(Default)]
    struct Model(HashMap<usize, Vec<(u64, u32)>>);

    impl Model {
        fn get(&mut self, set: usize, key: u64) -> Option<u32> {
            let keys = self.0.entry(set).or_default();
            let i = keys.iter().position(|(k, _)| *k == key)?;
            let kv = keys.remove(i);
            keys.insert(0, kv);
            Some(kv.1)
        }

        fn put(&mut self, set: usize, key: u64, v: u32) {
            let keys = self.0.entry(set).or_default();
            keys.retain(|(k, _)| *k != key);
            keys.insert(0, (key, v));
            keys.truncate(2);
        }
    }

    proptest! {
        /// Against the plain model: a key is found with its last value exactly while its set
        /// has not taken two other keys since it was last kept or read.
        #[test]
        fn slots_match_a_model(sets in 1usize..5, hashed: bool, ops in prop::collection::vec((0u64..30, 0u8..3, 0u32..1000), 1..300)) {
            let s = Slots::new(2 * sets, if hashed { Placement::Hashed } else { Placement::Direct });
            let mut model = Model::default();
            for (key, op, v) in ops {
                let set = s.set_of(key, sets);
                prop_assert!(set < sets);
                match op {
                    0 => {
                        s.put(key, v);
                        model.put(set, key, v);
                    }
                    1 => prop_assert_eq!(s.get(key), model.get(set, key)),
                    _ => {
                        // an update in place is seen by the next read
                        let got = s.with(key, |x| {
                            *x += 1;
                            *x
                        });
                        let want = model.get(set, key).map(|x| x + 1);
                        prop_assert_eq!(got, want);
                        if let Some(x) = want {
                            model.put(set, key, x);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn direct_keys_within_n_are_all_kept_and_hashed_pairs_spread() {
        let s: Slots<u64> = Slots::new(4096, Placement::Direct);
        for k in 0..4096 {
            s.put(k + 10_000, k);
        }
        assert!((0..4096).all(|k| s.get(k + 10_000) == Some(k)));
        // a third key of a set pushes out the one used least recently
        s.get(10_000);
        s.put(10_000 + 4096, 1);
        assert_eq!(s.get(10_000), Some(0));
        assert_eq!(s.get(10_000 + 2048), None);
        // (goal, product) pairs: one goal's 50 products and one product's 50 goals
        let h: Slots<()> = Slots::new(4096, Placement::Hashed);
        let keys = (0..50u64)
            .map(|p| (7 << 32) | p)
            .chain((0..50u64).map(|g| (g << 32) | 3));
        let distinct: std::collections::HashSet<usize> = keys.map(|k| h.set_of(k, 2048)).collect();
        assert!(distinct.len() >= 95, "{}", distinct.len());
    }

    #[test]
    #[should_panic(expected = "n must be even")]
    fn an_odd_size_is_refused() {
        let _ = Slots::<u8>::new(3, Placement::Direct);
    }
}
