//! [`Slots`]: what a shop keeps of its recent work (goals started, rewards of purchases, the
//! Python objects of a reset), shared by its envs. A group of envs plays the same goal at about
//! the same time, so keeping the last few thousand keys catches nearly every repeat, at a fixed
//! cost in memory and with no eviction bookkeeping.

use std::sync::{Mutex, MutexGuard};

/// Where a key goes.
#[derive(Clone, Copy, Debug)]
pub enum Placement {
    /// Slot `key % n`: consecutive keys (goal indices) never collide within `n`.
    Direct,
    /// A multiplicative hash of the whole key: for keys made of two parts (goal, product).
    Hashed,
}

/// A direct-mapped cache of values by `u64` key: key `k` has one slot, and a newer key takes
/// that slot over. One lock guards all slots; callers make values outside it, and a value pushed
/// out is dropped after the lock is released (dropping Python objects can run Python code).
#[derive(Debug)]
pub struct Slots<V> {
    slots: Mutex<Vec<Option<(u64, V)>>>,
    placement: Placement,
}

impl<V> Slots<V> {
    /// `n` empty slots (`n >= 1`).
    pub fn new(n: usize, placement: Placement) -> Slots<V> {
        assert!(n >= 1, "Slots::new: n must be >= 1");
        Slots {
            slots: Mutex::new((0..n).map(|_| None).collect()),
            placement,
        }
    }

    /// The slot of `key` among `n`.
    pub fn slot_of(&self, key: u64, n: usize) -> usize {
        match self.placement {
            Placement::Direct => (key % n as u64) as usize,
            // the product's high bits, scaled to [0, n)
            Placement::Hashed => ((key.wrapping_mul(0x9E37_79B9_7F4A_7C15) as u128 * n as u128) >> 64) as usize,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Option<(u64, V)>>> {
        // a panic while holding the lock leaves whole values behind: the slots stay usable
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` of the value kept for `key` (under the lock: keep `f` short), None when not kept.
    pub fn with<R>(&self, key: u64, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut slots = self.lock();
        let i = self.slot_of(key, slots.len());
        match &mut slots[i] {
            Some((k, v)) if *k == key => Some(f(v)),
            _ => None,
        }
    }

    /// Keeps `value` for `key`, pushing out what its slot held.
    pub fn put(&self, key: u64, value: V) {
        let old = {
            let mut slots = self.lock();
            let i = self.slot_of(key, slots.len());
            slots[i].replace((key, value))
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

    proptest! {
        /// Against a plain model: a key is found with its last value exactly while no other key
        /// of its slot was put after it.
        #[test]
        fn slots_match_a_model(n in 1usize..9, hashed: bool, ops in prop::collection::vec((0u64..40, any::<bool>(), 0u32..1000), 1..200)) {
            let s = Slots::new(n, if hashed { Placement::Hashed } else { Placement::Direct });
            let mut model: HashMap<usize, (u64, u32)> = HashMap::new();
            for (key, is_put, v) in ops {
                let slot = s.slot_of(key, n);
                prop_assert!(slot < n);
                if is_put {
                    s.put(key, v);
                    model.insert(slot, (key, v));
                } else {
                    let want = model.get(&slot).filter(|(k, _)| *k == key).map(|(_, v)| *v);
                    prop_assert_eq!(s.get(key), want);
                    // an update in place is seen by the next read
                    if s.with(key, |x| *x += 1).is_some() {
                        model.insert(slot, (key, want.unwrap() + 1));
                    }
                }
            }
        }
    }

    #[test]
    fn direct_keys_within_n_never_collide_and_hashed_pairs_spread() {
        let s: Slots<u64> = Slots::new(4096, Placement::Direct);
        for k in 0..4096 {
            s.put(k + 10_000, k);
        }
        assert!((0..4096).all(|k| s.get(k + 10_000) == Some(k)));
        assert_eq!(s.get(10_000 + 4096), None);
        // (goal, product) pairs: one goal's 50 products and one product's 50 goals
        let h: Slots<()> = Slots::new(4096, Placement::Hashed);
        let keys = (0..50u64)
            .map(|p| (7 << 32) | p)
            .chain((0..50u64).map(|g| (g << 32) | 3));
        let distinct: std::collections::HashSet<usize> = keys.map(|k| h.slot_of(k, 4096)).collect();
        assert!(distinct.len() >= 97, "{}", distinct.len());
    }
}
