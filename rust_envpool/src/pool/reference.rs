//! The plain reference for [`super::EnvPool`]: the same API and rules with no threads. A request
//! is applied the moment it is sent, and results are received in send order. Tests drive both with
//! the same calls and compare (the threaded pool may finish requests in another order, so the
//! async comparison matches results by env, see `tests.rs`).

use std::collections::VecDeque;

use super::slot::{EnvSlot, Op, SlotRules, StepResult};
use super::{out_of_range, EnvFactory, PoolConfig, PoolError};

pub struct SequentialPool {
    slots: Vec<EnvSlot>,
    rules: SlotRules,
    /// Per env: a request was sent and its result not yet received.
    busy: Vec<bool>,
    /// Results sent and not yet received, in send order.
    queue: VecDeque<StepResult>,
}

impl SequentialPool {
    pub fn new(factories: Vec<EnvFactory>, config: PoolConfig) -> Result<Self, PoolError> {
        if factories.is_empty() {
            return Err(PoolError::arg("games", "need at least one game (env factory)"));
        }
        if config.group_size == 0 {
            return Err(PoolError::arg("group_size", "must be >= 1"));
        }
        let mut slots = Vec::new();
        for f in &factories {
            for _ in 0..config.group_size {
                slots.push(EnvSlot::new(slots.len(), f()));
            }
        }
        let n = slots.len();
        Ok(Self {
            slots,
            rules: SlotRules {
                max_steps: config.max_steps,
                auto_reset: config.auto_reset,
            },
            busy: vec![false; n],
            queue: VecDeque::new(),
        })
    }

    pub fn num_envs(&self) -> usize {
        self.slots.len()
    }

    pub fn outstanding(&self) -> usize {
        self.queue.len()
    }

    /// Validates a call, then applies each request in order.
    fn apply(&mut self, ops: Vec<Op>, arg: &'static str, env_ids: &[i64]) -> Result<Vec<StepResult>, PoolError> {
        if ops.len() != env_ids.len() {
            return Err(PoolError::arg(arg, "length differs from env_ids"));
        }
        let n = self.slots.len();
        for (k, id) in env_ids.iter().enumerate() {
            if env_ids[..k].contains(id) {
                return Err(PoolError::arg("env_ids", format!("duplicate env id {id}")));
            }
            if *id >= 0 && (*id as usize) < n && self.busy[*id as usize] {
                return Err(PoolError::arg("env_ids", format!("env {id} is busy")));
            }
        }
        let rules = self.rules;
        Ok(ops
            .iter()
            .zip(env_ids)
            .map(|(op, &id)| {
                if id < 0 || id as usize >= n {
                    out_of_range(id, n)
                } else {
                    self.slots[id as usize].run(op, rules)
                }
            })
            .collect())
    }

    fn mark(&mut self, results: &[StepResult], busy: bool) {
        for r in results {
            if r.env_id >= 0 && (r.env_id as usize) < self.slots.len() {
                self.busy[r.env_id as usize] = busy;
            }
        }
    }

    pub fn send(&mut self, actions: Vec<String>, env_ids: &[i64]) -> Result<(), PoolError> {
        let results = self.apply(actions.into_iter().map(Op::Step).collect(), "actions", env_ids)?;
        self.mark(&results, true);
        self.queue.extend(results);
        Ok(())
    }

    pub fn send_reset(&mut self, env_ids: &[i64]) -> Result<(), PoolError> {
        let results = self.apply(vec![Op::Reset; env_ids.len()], "env_ids", env_ids)?;
        self.mark(&results, true);
        self.queue.extend(results);
        Ok(())
    }

    /// The first `batch_size` outstanding results in send order.
    pub fn recv(&mut self, batch_size: usize) -> Result<Vec<StepResult>, PoolError> {
        if batch_size == 0 || batch_size > self.queue.len() {
            return Err(PoolError::arg("batch_size", "not in 1..=outstanding"));
        }
        let out: Vec<StepResult> = self.queue.drain(..batch_size).collect();
        self.mark(&out, false);
        Ok(out)
    }

    /// Receives the outstanding result equal to `result` (the threaded pool chose to return it
    /// first); false when there is none.
    pub fn recv_matching(&mut self, result: &StepResult) -> bool {
        match self.queue.iter().position(|r| r == result) {
            Some(k) => {
                let r = self.queue.remove(k).expect("position is in range");
                self.mark(std::slice::from_ref(&r), false);
                true
            }
            None => false,
        }
    }

    pub fn step(&mut self, actions: Vec<String>, env_ids: &[i64]) -> Result<Vec<StepResult>, PoolError> {
        self.apply(actions.into_iter().map(Op::Step).collect(), "actions", env_ids)
    }

    pub fn reset(&mut self, env_ids: &[i64]) -> Result<Vec<StepResult>, PoolError> {
        self.apply(vec![Op::Reset; env_ids.len()], "env_ids", env_ids)
    }
}
