//! One call's requests, split by the worker thread each env calls home.
//!
//! An env is stepped by its home thread whenever that thread gets to it, so the env's memory
//! stays with one thread: the allocator arena its strings and maps come from (freeing into
//! another thread's arena takes that arena's lock) and that core's cache. With envs handed to
//! whichever thread was free, a step of the ALFWorld engine cost ~30-60 % more CPU on 2 threads
//! than on 1. Each thread works through its own part first and then helps with what the others
//! have left, so a thread that is slow (or descheduled) does not hold a call up; every request is
//! claimed by exactly one thread.

use std::sync::atomic::{AtomicUsize, Ordering};

struct Part<T> {
    items: Vec<T>,
    /// Index of the next unclaimed item (may run past the end).
    next: AtomicUsize,
}

/// Items split into parts by home thread (see the module docs).
pub struct Batch<T> {
    parts: Vec<Part<T>>,
}

impl<T> Batch<T> {
    /// Splits `items` into `parts` parts (at least 1), item `x` into part `home(x) % parts`,
    /// keeping their order within a part.
    pub fn new(items: impl IntoIterator<Item = T>, parts: usize, home: impl Fn(&T) -> usize) -> Self {
        let parts = parts.max(1);
        let mut split: Vec<Vec<T>> = (0..parts).map(|_| Vec::new()).collect();
        for x in items {
            split[home(&x) % parts].push(x);
        }
        let parts = split
            .into_iter()
            .map(|items| Part {
                items,
                next: AtomicUsize::new(0),
            })
            .collect();
        Batch { parts }
    }

    /// Calls `f` on every item no caller has claimed yet: those of part `worker` first, then the
    /// other parts' leftovers, in part order.
    pub fn run(&self, worker: usize, mut f: impl FnMut(&T)) {
        let k = self.parts.len();
        for d in 0..k {
            let part = &self.parts[(worker + d) % k];
            loop {
                // Relaxed: the counter only hands out indices; the items were published with
                // the batch itself.
                let i = part.next.fetch_add(1, Ordering::Relaxed);
                match part.items.get(i) {
                    Some(x) => f(x),
                    None => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn own_part_first_then_the_leftovers() {
        let b = Batch::new(0..10, 3, |x| *x);
        let mut seen = Vec::new();
        b.run(1, |x| seen.push(*x));
        assert_eq!(seen, vec![1, 4, 7, 2, 5, 8, 0, 3, 6, 9]);
        b.run(0, |_| panic!("all claimed"));
        let one = Batch::new(["a", "b"], 0, |_| 7);
        let mut seen = Vec::new();
        one.run(5, |x| seen.push(*x));
        assert_eq!(seen, vec!["a", "b"]);
    }

    #[test]
    fn threads_claim_every_item_once() {
        let n = 10_000;
        let b = Batch::new(0..n, 4, |x| x / 7);
        let claimed = Mutex::new(vec![0u32; n]);
        let per_thread: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|w| {
                    let (b, claimed) = (&b, &claimed);
                    s.spawn(move || {
                        let mut count = 0;
                        b.run(w, |&x| {
                            claimed.lock().unwrap()[x] += 1;
                            count += 1;
                        });
                        count
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(claimed.into_inner().unwrap().iter().all(|&c| c == 1));
        assert_eq!(per_thread.iter().sum::<usize>(), n);
    }
}
