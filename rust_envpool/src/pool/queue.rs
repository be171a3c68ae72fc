//! Main-thread bookkeeping of the pool's outstanding requests: which envs have a request in
//! flight, which finished and wait to be received (in completion order), and requests rejected
//! before reaching an env. No threads here, so the ordering rules are unit-tested directly.
//!
//! Each env has at most one outstanding request: `Idle -> InFlight -> Ready -> Idle`.

use std::collections::VecDeque;

use super::slot::StepResult;

/// Where one env's request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outstanding {
    Idle,
    InFlight,
    Ready,
}

/// A finished request waiting for `recv`.
#[derive(Debug)]
pub enum Entry {
    /// The env finished; its result sits in the env's output slot.
    Env(usize),
    /// Rejected before reaching an env (e.g. an env id out of range); the result is here.
    Rejected(Box<StepResult>),
}

/// Outstanding-request tracker (see the module docs).
#[derive(Debug)]
pub struct Tracker {
    state: Vec<Outstanding>,
    ready: VecDeque<Entry>,
    in_flight: usize,
}

impl Tracker {
    pub fn new(num_envs: usize) -> Self {
        Self {
            state: vec![Outstanding::Idle; num_envs],
            ready: VecDeque::new(),
            in_flight: 0,
        }
    }

    pub fn state(&self, env: usize) -> Outstanding {
        self.state[env]
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Requests sent and not yet received (in flight + ready).
    pub fn outstanding(&self) -> usize {
        self.in_flight + self.ready.len()
    }

    /// Marks a request sent to `env` (which must be idle).
    pub fn start(&mut self, env: usize) {
        assert_eq!(
            self.state[env],
            Outstanding::Idle,
            "env {env} already has a request outstanding"
        );
        self.state[env] = Outstanding::InFlight;
        self.in_flight += 1;
    }

    /// Queues a result that never went to an env.
    pub fn push_rejected(&mut self, result: StepResult) {
        self.ready.push_back(Entry::Rejected(Box::new(result)));
    }

    /// Marks `env`'s request finished; it joins the ready queue behind earlier finishers.
    pub fn complete(&mut self, env: usize) {
        assert_eq!(
            self.state[env],
            Outstanding::InFlight,
            "env {env} completed but was not in flight"
        );
        self.state[env] = Outstanding::Ready;
        self.in_flight -= 1;
        self.ready.push_back(Entry::Env(env));
    }

    /// The first `n` ready entries in completion order (`n <= ready_len()`); their envs become idle.
    pub fn pop_front(&mut self, n: usize) -> Vec<Entry> {
        assert!(
            n <= self.ready.len(),
            "asked for {n} ready entries, {} ready",
            self.ready.len()
        );
        let out: Vec<Entry> = self.ready.drain(..n).collect();
        for e in &out {
            if let Entry::Env(i) = e {
                self.state[*i] = Outstanding::Idle;
            }
        }
        out
    }

    /// Removes the ready entries of the envs flagged in `wanted` (all must be ready), keeping the
    /// order of the other ready entries; those envs become idle.
    pub fn take_envs(&mut self, wanted: &[bool]) {
        self.ready.retain(|e| !matches!(e, Entry::Env(i) if wanted[*i]));
        for (i, w) in wanted.iter().enumerate() {
            if *w {
                assert_eq!(self.state[i], Outstanding::Ready, "env {i} taken before it was ready");
                self.state[i] = Outstanding::Idle;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(entries: &[Entry]) -> Vec<i64> {
        entries
            .iter()
            .map(|e| match e {
                Entry::Env(i) => *i as i64,
                Entry::Rejected(r) => r.env_id,
            })
            .collect()
    }

    fn rejected(id: i64) -> StepResult {
        StepResult::failed(id, "bad".into(), 0.0, String::new(), 0)
    }

    #[test]
    fn completion_order_not_send_order() {
        let mut t = Tracker::new(4);
        for i in 0..4 {
            t.start(i);
        }
        assert_eq!((t.in_flight(), t.ready_len(), t.outstanding()), (4, 0, 4));
        t.complete(2);
        t.complete(0);
        assert_eq!(ids(&t.pop_front(1)), vec![2]);
        assert_eq!(t.state(2), Outstanding::Idle);
        assert_eq!(t.state(0), Outstanding::Ready);
        t.complete(3);
        assert_eq!(ids(&t.pop_front(2)), vec![0, 3]);
        assert_eq!((t.in_flight(), t.outstanding()), (1, 1));
    }

    #[test]
    fn rejected_entries_queue_with_finishers() {
        let mut t = Tracker::new(2);
        t.start(1);
        t.push_rejected(rejected(-5));
        t.complete(1);
        assert_eq!(t.outstanding(), 2);
        assert_eq!(ids(&t.pop_front(2)), vec![-5, 1]);
    }

    #[test]
    fn take_envs_keeps_the_others_in_order() {
        let mut t = Tracker::new(5);
        for i in [4, 1, 3, 0] {
            t.start(i);
        }
        for i in [3, 4, 0, 1] {
            t.complete(i);
        }
        t.take_envs(&[false, true, false, true, false]);
        assert_eq!(t.state(3), Outstanding::Idle);
        assert_eq!(ids(&t.pop_front(2)), vec![4, 0]);
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    #[should_panic(expected = "already has a request outstanding")]
    fn double_start_is_a_bug() {
        let mut t = Tracker::new(1);
        t.start(0);
        t.start(0);
    }

    #[test]
    #[should_panic(expected = "was not in flight")]
    fn completing_an_idle_env_is_a_bug() {
        let mut t = Tracker::new(1);
        t.complete(0);
    }
}
