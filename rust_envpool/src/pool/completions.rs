//! Where workers post the ids of envs whose request finished, and where the calling thread waits
//! for them.
//!
//! A channel that wakes its receiver once per message costs two context switches per env step
//! (the worker's futex wake, the receiver's sleep), which on a busy pool is more CPU than the
//! step itself for light envs. Here the waiter says how many ids it needs before it can make
//! progress (`wake_at`), and a worker wakes it only when that many have been posted; every other
//! post is a short uncontended lock and a push.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Default)]
struct State {
    /// Finished env ids not yet taken by the waiter, in completion order.
    posted: Vec<usize>,
    /// The waiter sleeps until `posted.len() >= wake_at`; 0: nobody is waiting.
    wake_at: usize,
}

/// The completion board (see the module docs). One waiter at a time (the pool's owner).
#[derive(Default)]
pub struct Completions {
    state: Mutex<State>,
    ready: Condvar,
}

impl Completions {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding this lock; recover the data if something ever did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts one finished env id; wakes the waiter if it now has as many ids as it asked for.
    pub fn post(&self, env: usize) {
        let mut s = self.lock();
        s.posted.push(env);
        if s.wake_at != 0 && s.posted.len() >= s.wake_at {
            s.wake_at = 0;
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Waits until at least `want` ids are posted (or `timeout` passes), then moves every posted
    /// id to `out` (cleared first) in completion order. `want == 0` does not wait.
    pub fn wait(&self, want: usize, timeout: Duration, out: &mut Vec<usize>) {
        out.clear();
        let mut s = self.lock();
        if s.posted.len() < want {
            s.wake_at = want;
            s = self
                .ready
                .wait_timeout_while(s, timeout, |s| s.posted.len() < want)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            s.wake_at = 0;
        }
        std::mem::swap(&mut s.posted, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;
    use std::time::Instant;

    #[test]
    fn takes_everything_posted_in_order() {
        let c = Completions::default();
        let mut out = vec![99];
        c.wait(0, Duration::ZERO, &mut out);
        assert!(out.is_empty());
        for i in [3, 1, 2] {
            c.post(i);
        }
        c.wait(2, Duration::ZERO, &mut out);
        assert_eq!(out, vec![3, 1, 2]);
        c.wait(0, Duration::ZERO, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn times_out_with_what_it_has() {
        let c = Completions::default();
        c.post(7);
        let t0 = Instant::now();
        let mut out = Vec::new();
        c.wait(2, Duration::from_millis(20), &mut out);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        assert_eq!(out, vec![7]);
    }

    #[test]
    fn wakes_when_enough_are_posted_by_several_threads() {
        let c = Arc::new(Completions::default());
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let c = Arc::clone(&c);
                thread::spawn(move || {
                    for k in 0..250 {
                        c.post(t * 1000 + k);
                    }
                })
            })
            .collect();
        let mut got = Vec::new();
        let mut out = Vec::new();
        while got.len() < 1000 {
            c.wait(1000 - got.len(), Duration::from_secs(10), &mut out);
            got.extend_from_slice(&out);
        }
        for w in workers {
            w.join().unwrap();
        }
        got.sort_unstable();
        let mut want: Vec<usize> = (0..4).flat_map(|t| (0..250).map(move |k| t * 1000 + k)).collect();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
