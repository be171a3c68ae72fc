//! Ids for the strings that a pool's results repeat step after step and env after env —
//! admissible commands, task types — assigned on the worker thread right after the env step,
//! while the strings are still in that core's cache. The caller can then share one object per
//! distinct string (the Python layer does, `python/columns.rs`) by looking up an integer instead
//! of reading and hashing each string again on its own, serial, thread.

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The id of a string the table is too full to take.
pub const NO_ID: u32 = u32::MAX;

/// Distinct strings -> dense ids (0, 1, 2, ... in order of first sight), shared by the workers.
/// Bounded: once it holds `limit` strings, new ones get [`NO_ID`].
pub struct StringTable {
    ids: RwLock<HashMap<Box<str>, u32, ahash::RandomState>>,
    limit: usize,
}

impl StringTable {
    pub fn new(limit: usize) -> Self {
        let limit = limit.min(NO_ID as usize);
        Self {
            ids: RwLock::new(HashMap::default()),
            limit,
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<Box<str>, u32, ahash::RandomState>> {
        // Nothing panics while holding the lock; recover the data if something ever did.
        self.ids.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<Box<str>, u32, ahash::RandomState>> {
        self.ids.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of strings with an id.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id of `s`, if it has one.
    pub fn get(&self, s: &str) -> Option<u32> {
        self.read().get(s).copied()
    }

    /// The id of each string, in order; strings seen for the first time get the next ids (or
    /// [`NO_ID`] once the table is full). One shared lock in the common case (all known).
    pub fn ids<'a, I>(&self, strings: I) -> Vec<u32>
    where
        I: Iterator<Item = &'a str> + Clone,
    {
        let mut missing = false;
        let mut out: Vec<u32> = {
            let map = self.read();
            strings
                .clone()
                .map(|s| {
                    map.get(s).copied().unwrap_or_else(|| {
                        missing = true;
                        NO_ID
                    })
                })
                .collect()
        };
        if missing {
            let mut map = self.write();
            for (id, s) in out.iter_mut().zip(strings) {
                if *id != NO_ID {
                    continue;
                }
                let next = map.len();
                *id = match map.get(s) {
                    Some(&known) => known,
                    None if next < self.limit => {
                        map.insert(s.into(), next as u32);
                        next as u32
                    }
                    None => NO_ID,
                };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_ids_in_order_of_first_sight() {
        let t = StringTable::new(100);
        assert_eq!(t.ids(["b", "a", "b"].into_iter()), vec![0, 1, 0]);
        assert_eq!(t.ids(["a", "c"].into_iter()), vec![1, 2]);
        assert_eq!((t.len(), t.get("c"), t.get("d")), (3, Some(2), None));
        assert!(t.ids(std::iter::empty()).is_empty());
    }

    #[test]
    fn full_table_gives_no_id_to_new_strings() {
        let t = StringTable::new(2);
        assert_eq!(t.ids(["x", "y", "z", "x"].into_iter()), vec![0, 1, NO_ID, 0]);
        assert_eq!(t.ids(["z", "y"].into_iter()), vec![NO_ID, 1]);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn threads_agree_on_ids() {
        let t = StringTable::new(1000);
        let words: Vec<String> = (0..200).map(|i| format!("go to cabinet {i}")).collect();
        let per_thread: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|k| {
                    let (t, words) = (&t, &words);
                    s.spawn(move || {
                        let order: Vec<&str> = (0..200).map(|i| words[(i * 7 + k * 13) % 200].as_str()).collect();
                        let ids = t.ids(order.iter().copied());
                        // back in word order
                        let mut by_word = vec![NO_ID; 200];
                        for (w, id) in order.iter().zip(ids) {
                            by_word[words.iter().position(|x| x == w).unwrap()] = id;
                        }
                        by_word
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(per_thread.windows(2).all(|w| w[0] == w[1]));
        let mut ids = per_thread[0].clone();
        ids.sort_unstable();
        assert_eq!(ids, (0..200).collect::<Vec<u32>>());
    }
}
