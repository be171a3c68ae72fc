//! One environment's state machine inside the pool: reset, step, the auto-reset rule, the step
//! limit, and panic isolation. The threaded pool and the sequential reference both drive envs
//! through [`EnvSlot::run`], so the per-env rules live in exactly one place.
//!
//! States: `Fresh` (never reset) -> `Running` -> `Done` (the game said done, or the step limit hit)
//! and `Broken` (the env panicked). A reset from any state goes to `Running` (or `Broken` again if
//! the reset itself panics).

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::envs::{EnvStep, TextEnv};

/// What to do to one env.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Reset,
    Step(String),
    /// A step request that was rejected before reaching the env (e.g. an action that is not
    /// valid text): answered as this env's error, the env is not touched.
    Invalid(String),
}

/// Everything the pool reports for one env after a reset or step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepResult {
    /// The env id as the caller gave it (an out-of-range id is echoed back with an `error`).
    pub env_id: i64,
    pub obs: String,
    pub admissible: Vec<String>,
    /// Score delta of this step (0.0 on reset).
    pub reward: f64,
    pub score: f64,
    /// The episode is over: the game said so, the step limit was hit (`truncated`), or `error` is set.
    pub done: bool,
    pub won: bool,
    /// `done` because the pool's step limit was reached while the game was still going.
    pub truncated: bool,
    pub task_type: String,
    /// Steps taken in the current episode (0 right after a reset).
    pub step_count: u32,
    /// Why this env's request failed (`None`: it did not). A result with an error has `done` set,
    /// empty `obs`/`admissible` and reward 0. A rejected request leaves the env as it was; a
    /// panic marks the env broken; a step the game itself refuses the way its reference engine
    /// raises ([`crate::envs::TextEnv::step_checked`], WebShop) ends the episode, with the env in
    /// the state the reference engine leaves.
    pub error: Option<String>,
    /// Ids of `admissible` and then `task_type` in the pool's string table, when the pool keeps
    /// one ([`super::PoolConfig::string_ids`]); None otherwise and for rejected requests.
    pub string_ids: Option<Vec<u32>>,
    /// WebShop: the page has the search bar; false for the other games.
    pub has_search_bar: bool,
}

impl StepResult {
    /// The result reported for a request that could not be applied to the env.
    pub fn failed(env_id: i64, error: String, score: f64, task_type: String, step_count: u32) -> Self {
        Self {
            env_id,
            obs: String::new(),
            admissible: Vec::new(),
            reward: 0.0,
            score,
            done: true,
            won: false,
            truncated: false,
            task_type,
            step_count,
            error: Some(error),
            string_ids: None,
            has_search_bar: false,
        }
    }
}

/// Per-env rules shared by every env of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRules {
    /// Truncate an episode after this many steps (`done` + `truncated`); 0: no limit.
    pub max_steps: u32,
    /// The auto-reset rule (see [`EnvSlot::run`]). Off: stepping an env that is done (or was never
    /// reset) is an error for that env.
    pub auto_reset: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum Status {
    Fresh,
    Running,
    Done,
    Broken(String),
}

/// One env plus the pool's bookkeeping for it.
pub struct EnvSlot {
    id: usize,
    env: Box<dyn TextEnv>,
    status: Status,
    step_count: u32,
    last_score: f64,
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

impl EnvSlot {
    pub fn new(id: usize, env: Box<dyn TextEnv>) -> Self {
        Self {
            id,
            env,
            status: Status::Fresh,
            step_count: 0,
            last_score: 0.0,
        }
    }

    pub fn task_type(&self) -> String {
        self.env.task_type().to_owned()
    }

    pub fn task(&self) -> String {
        self.env.task().to_owned()
    }

    /// Whether the env is broken (panicked and not successfully reset since).
    pub fn is_broken(&self) -> bool {
        matches!(self.status, Status::Broken(_))
    }

    fn fail(&self, error: String) -> StepResult {
        StepResult::failed(
            self.id as i64,
            error,
            self.last_score,
            self.task_type(),
            self.step_count,
        )
    }

    fn ok(&self, s: EnvStep, reward: f64, truncated: bool) -> StepResult {
        StepResult {
            env_id: self.id as i64,
            has_search_bar: s.has_search_bar,
            obs: s.obs,
            admissible: s.admissible,
            reward,
            score: s.score,
            done: s.done || truncated,
            won: s.won,
            truncated,
            task_type: self.task_type(),
            step_count: self.step_count,
            error: None,
            string_ids: None,
        }
    }

    fn do_reset(&mut self) -> StepResult {
        match catch_unwind(AssertUnwindSafe(|| self.env.reset())) {
            Ok(s) => {
                self.step_count = 0;
                self.last_score = s.score;
                self.status = if s.done { Status::Done } else { Status::Running };
                self.ok(s, 0.0, false)
            }
            Err(p) => {
                let msg = format!("env {} panicked in reset: {}", self.id, panic_message(&*p));
                self.status = Status::Broken(msg.clone());
                self.fail(format!("{msg}; the env is marked broken until a reset succeeds"))
            }
        }
    }

    /// Applies `op` and reports the result. The rules, in order:
    ///
    /// 1. `Reset`: resets the env from any state (also a broken one); reward 0, step count 0.
    /// 2. `Step` on a broken env: error result (done), the env stays broken.
    /// 3. `Step` on an env that is done or was never reset:
    ///    * auto-reset on: the action is ignored and the env is reset; the call returns the reset
    ///      observation (reward 0, step count 0, done false). This is envpool's rule: the step that
    ///      returns `done` shows the final observation, the *next* step starts the new episode.
    ///    * auto-reset off: error result (done), the env is unchanged.
    /// 4. `Step` on a running env: the game applies the command; the step count goes up by one;
    ///    reward = score - previous score. If the game is not done but the step count reached
    ///    `max_steps`, the result is `done` and `truncated` (won as the game says).
    /// 5. A panic inside the env's reset or step is caught: the result carries the panic message
    ///    as its error (done) and the env is broken until a reset succeeds.
    pub fn run(&mut self, op: &Op, rules: SlotRules) -> StepResult {
        let action = match op {
            Op::Reset => return self.do_reset(),
            Op::Step(a) => a,
            Op::Invalid(msg) => return self.fail(format!("env {}: {msg}", self.id)),
        };
        match &self.status {
            Status::Broken(msg) => {
                return self.fail(format!("env {} is broken ({msg}); reset it", self.id));
            }
            Status::Fresh | Status::Done if rules.auto_reset => return self.do_reset(),
            Status::Fresh => {
                return self.fail(format!(
                    "env {} has not been reset yet (auto_reset is off); reset it before stepping",
                    self.id
                ));
            }
            Status::Done => {
                return self.fail(format!(
                    "env {} is done (auto_reset is off); reset it before stepping again",
                    self.id
                ));
            }
            Status::Running => {}
        }
        match catch_unwind(AssertUnwindSafe(|| self.env.step_checked(action))) {
            Ok(Err(msg)) => {
                // the game raised (as its reference engine does): this env's error; the episode
                // is over until a reset
                self.step_count = self.step_count.saturating_add(1);
                self.status = Status::Done;
                self.fail(format!("env {}: {msg}", self.id))
            }
            Ok(Ok(s)) => {
                self.step_count = self.step_count.saturating_add(1);
                let reward = s.score - self.last_score;
                self.last_score = s.score;
                let truncated = !s.done && rules.max_steps > 0 && self.step_count >= rules.max_steps;
                if s.done || truncated {
                    self.status = Status::Done;
                }
                self.ok(s, reward, truncated)
            }
            Err(p) => {
                let msg = format!(
                    "env {} panicked in step {}: {}",
                    self.id,
                    self.step_count + 1,
                    panic_message(&*p)
                );
                self.status = Status::Broken(msg.clone());
                self.fail(format!("{msg}; the env is marked broken until reset"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::dummy::{DummyConfig, DummyEnv};

    fn slot(len: u32, panic_at: Option<u32>) -> EnvSlot {
        let cfg = DummyConfig {
            seed: 5,
            episode_len: len,
            busy_iters: 0,
            panic_at_step: panic_at,
        };
        EnvSlot::new(3, Box::new(DummyEnv::new(cfg)))
    }

    fn target(len: u32, t: u32) -> String {
        DummyEnv::new(DummyConfig {
            seed: 5,
            episode_len: len,
            ..Default::default()
        })
        .target(t)
        .to_owned()
    }

    const MANUAL: SlotRules = SlotRules {
        max_steps: 0,
        auto_reset: false,
    };
    const AUTO: SlotRules = SlotRules {
        max_steps: 0,
        auto_reset: true,
    };

    #[test]
    fn auto_reset_rule_step_by_step() {
        let mut s = slot(2, None);
        // Never reset + auto-reset: the first step resets and ignores the action.
        let r = s.run(&Op::Step("go east".into()), AUTO);
        assert!(r.error.is_none() && !r.done && r.step_count == 0 && r.reward == 0.0);
        assert!(r.obs.contains("step 1 of 2"));
        // Step 1 (right).
        let r = s.run(&Op::Step(target(2, 0)), AUTO);
        assert_eq!((r.step_count, r.done, r.reward), (1, false, 0.5));
        // Step 2 (right): done and won; this call returns the final observation.
        let r = s.run(&Op::Step(target(2, 1)), AUTO);
        assert_eq!((r.step_count, r.done, r.won, r.truncated), (2, true, true, false));
        assert_eq!((r.reward, r.score), (0.5, 1.0));
        assert!(r.obs.contains("game is over"));
        // Next step: the action is ignored and the reset observation comes back.
        let r = s.run(&Op::Step("go west".into()), AUTO);
        assert_eq!(
            (r.step_count, r.done, r.won, r.reward, r.score),
            (0, false, false, 0.0, 0.0)
        );
        assert!(r.obs.contains("step 1 of 2") && r.error.is_none());
        // And the episode goes on normally.
        let r = s.run(&Op::Step(target(2, 0)), AUTO);
        assert_eq!((r.step_count, r.done), (1, false));
    }

    #[test]
    fn manual_reset_rejects_steps_on_done_and_fresh_envs() {
        let mut s = slot(1, None);
        let r = s.run(&Op::Step("go east".into()), MANUAL);
        assert!(r.done && r.error.as_deref().unwrap().contains("has not been reset"));
        s.run(&Op::Reset, MANUAL);
        let r = s.run(&Op::Step("go east".into()), MANUAL);
        assert!(r.done && r.error.is_none());
        let r = s.run(&Op::Step("go east".into()), MANUAL);
        assert!(r.done && r.error.as_deref().unwrap().contains("is done"));
        assert_eq!(r.step_count, 1, "a rejected step leaves the env unchanged");
        let r = s.run(&Op::Reset, MANUAL);
        assert!(!r.done && r.step_count == 0);
    }

    #[test]
    fn step_limit_truncates_but_keeps_won() {
        let rules = SlotRules {
            max_steps: 2,
            auto_reset: false,
        };
        let mut s = slot(5, None);
        s.run(&Op::Reset, rules);
        let r = s.run(&Op::Step(target(5, 0)), rules);
        assert!(!r.done && !r.truncated);
        let r = s.run(&Op::Step(target(5, 1)), rules);
        assert!(r.done && r.truncated && !r.won && r.error.is_none());
        assert_eq!(r.step_count, 2);
        assert!(!r.obs.is_empty(), "a truncated step still shows the game's observation");
        // Game ends exactly at the limit: done, not truncated, won as the game says.
        let mut s = slot(2, None);
        s.run(&Op::Reset, rules);
        s.run(&Op::Step(target(2, 0)), rules);
        let r = s.run(&Op::Step(target(2, 1)), rules);
        assert!(r.done && !r.truncated && r.won);
    }

    #[test]
    fn panic_marks_broken_until_reset() {
        let mut s = slot(5, Some(2));
        s.run(&Op::Reset, MANUAL);
        assert!(s.run(&Op::Step("go east".into()), MANUAL).error.is_none());
        let r = s.run(&Op::Step("go east".into()), MANUAL);
        let e = r.error.unwrap();
        assert!(e.contains("panicked in step 2") && e.contains("told to panic"), "{e}");
        assert!(r.done && s.is_broken());
        let r = s.run(&Op::Step("go east".into()), AUTO);
        assert!(
            r.error.unwrap().contains("is broken"),
            "auto-reset does not revive a broken env"
        );
        let r = s.run(&Op::Reset, MANUAL);
        assert!(r.error.is_none() && !s.is_broken());
    }
}
