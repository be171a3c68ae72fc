//! `dummy`: a deterministic text game for testing and benchmarking the pool machinery without a
//! real engine.
//!
//! The game: an episode lasts `episode_len` steps. At step `t` (0-based) the observation names the
//! one command that is "right" at that step (picked from [`DUMMY_COMMANDS`] by a hash of the seed and
//! `t`). Each right command adds `1 / episode_len` to the score; the episode ends (`done`) after
//! `episode_len` steps and is won iff every command was right (score 1.0).
//!
//! Knobs for exercising the pool:
//! * `busy_iters`: CPU work per reset/step (iterations of an integer mixing loop), to stand in for
//!   an engine's step cost in benchmarks.
//! * `panic_at_step`: the env panics inside `step` when asked to play that step (1-based), to test
//!   panic isolation.
//! * The command `sleep <ms>` makes the step sleep that many milliseconds before answering (it then
//!   counts as a wrong command). Tests use it to control completion order in async mode.

use std::hint::black_box;
use std::time::Duration;

use crate::envs::{EnvStep, TextEnv};

/// The commands the dummy game admits, in sorted order (as engines report admissible commands).
pub const DUMMY_COMMANDS: [&str; 4] = ["go east", "go north", "go south", "go west"];

/// Task type reported by every dummy env.
pub const DUMMY_TASK_TYPE: &str = "dummy";

/// Configuration of a [`DummyEnv`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DummyConfig {
    /// Which game: the right command sequence is a function of the seed.
    pub seed: u64,
    /// Steps per episode (>= 1).
    pub episode_len: u32,
    /// Iterations of CPU busy work per reset and per step.
    pub busy_iters: u64,
    /// Panic inside `step` when playing this step of an episode (1-based); `None`: never.
    pub panic_at_step: Option<u32>,
}

impl Default for DummyConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            episode_len: 10,
            busy_iters: 0,
            panic_at_step: None,
        }
    }
}

/// The deterministic dummy game (see the module docs).
#[derive(Clone, Debug)]
pub struct DummyEnv {
    cfg: DummyConfig,
    task: String,
    t: u32,
    right: u32,
    done: bool,
}

/// SplitMix64 finaliser: a well-mixed hash of one word.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `iters` rounds of integer mixing that the optimiser cannot remove.
pub fn busy_work(iters: u64, salt: u64) -> u64 {
    let mut acc = salt;
    for i in 0..iters {
        acc = mix(black_box(acc ^ i));
    }
    black_box(acc)
}

impl DummyEnv {
    /// A new env; `episode_len` 0 is treated as 1.
    pub fn new(mut cfg: DummyConfig) -> Self {
        cfg.episode_len = cfg.episode_len.max(1);
        let task = format!("say the requested direction at each of {} steps", cfg.episode_len);
        Self {
            cfg,
            task,
            t: 0,
            right: 0,
            done: false,
        }
    }

    pub fn config(&self) -> &DummyConfig {
        &self.cfg
    }

    /// The right command at step `t` (0-based) of this game.
    pub fn target(&self, t: u32) -> &'static str {
        let h = mix(self.cfg.seed ^ mix(u64::from(t)));
        DUMMY_COMMANDS[(h % DUMMY_COMMANDS.len() as u64) as usize]
    }

    fn score(&self) -> f64 {
        f64::from(self.right) / f64::from(self.cfg.episode_len)
    }

    fn observe(&self, prefix: &str) -> EnvStep {
        let obs = if self.done {
            format!(
                "{prefix}The game is over: {} of {} right.",
                self.right, self.cfg.episode_len
            )
        } else {
            format!(
                "{prefix}Dummy game {}, step {} of {}: say '{}'.",
                self.cfg.seed,
                self.t + 1,
                self.cfg.episode_len,
                self.target(self.t)
            )
        };
        EnvStep {
            obs,
            admissible: if self.done {
                Vec::new()
            } else {
                DUMMY_COMMANDS.iter().map(|s| (*s).to_owned()).collect()
            },
            score: self.score(),
            done: self.done,
            won: self.done && self.right == self.cfg.episode_len,
            has_search_bar: false,
        }
    }
}

impl TextEnv for DummyEnv {
    fn reset(&mut self) -> EnvStep {
        busy_work(self.cfg.busy_iters, self.cfg.seed);
        self.t = 0;
        self.right = 0;
        self.done = false;
        self.observe("")
    }

    fn step(&mut self, command: &str) -> EnvStep {
        if self.done {
            // As text engines do: the game keeps answering after the end, and nothing changes.
            return self.observe("");
        }
        if self.cfg.panic_at_step == Some(self.t + 1) {
            panic!(
                "dummy env (seed {}) told to panic at step {}",
                self.cfg.seed,
                self.t + 1
            );
        }
        busy_work(self.cfg.busy_iters, self.cfg.seed ^ u64::from(self.t));
        if let Some(ms) = command
            .strip_prefix("sleep ")
            .and_then(|s| s.trim().parse::<u64>().ok())
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let right = command == self.target(self.t);
        if right {
            self.right += 1;
        }
        self.t += 1;
        self.done = self.t >= self.cfg.episode_len;
        self.observe(if right { "Right. " } else { "Wrong. " })
    }

    fn task_type(&self) -> &str {
        DUMMY_TASK_TYPE
    }

    fn task(&self) -> &str {
        &self.task
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(seed: u64, len: u32) -> DummyEnv {
        DummyEnv::new(DummyConfig {
            seed,
            episode_len: len,
            ..Default::default()
        })
    }

    #[test]
    fn commands_are_sorted() {
        let mut v = DUMMY_COMMANDS.to_vec();
        v.sort();
        assert_eq!(v, DUMMY_COMMANDS.to_vec());
    }

    #[test]
    fn playing_the_targets_wins() {
        let mut e = env(7, 5);
        let first = e.reset();
        assert!(!first.done && first.score == 0.0);
        assert_eq!(first.admissible.len(), 4);
        for t in 0..5 {
            let target = e.target(t);
            assert!(e.observe("").obs.contains(target));
            let s = e.step(target);
            assert!(s.obs.starts_with("Right. "));
            assert_eq!(s.done, t == 4);
        }
        let last = e.step("go north");
        assert!(last.done && last.won && last.score == 1.0);
    }

    #[test]
    fn one_wrong_command_loses() {
        let mut e = env(3, 3);
        e.reset();
        let wrong = DUMMY_COMMANDS.iter().find(|c| **c != e.target(0)).unwrap();
        let s = e.step(wrong);
        assert!(s.obs.starts_with("Wrong. "));
        e.step(e.target(1));
        let s = e.step(e.target(2));
        assert!(s.done && !s.won);
        assert!((s.score - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn deterministic_per_seed_and_reset_restarts() {
        let mut a = env(11, 4);
        let mut b = env(11, 4);
        assert_eq!(a.reset(), b.reset());
        assert_eq!(a.step("go west"), b.step("go west"));
        let r1 = a.reset();
        assert_eq!(r1, b.reset());
        // Different seeds give different games somewhere in the first few steps.
        let c = env(12, 16);
        assert!((0..16).any(|t| c.target(t) != a.target(t)));
    }

    #[test]
    #[should_panic(expected = "told to panic at step 2")]
    fn panics_where_told() {
        let mut e = DummyEnv::new(DummyConfig {
            panic_at_step: Some(2),
            ..Default::default()
        });
        e.reset();
        e.step("go east");
        e.step("go east");
    }

    #[test]
    fn busy_work_depends_on_input() {
        assert_ne!(busy_work(10, 1), busy_work(10, 2));
        assert_eq!(busy_work(0, 5), 5);
    }
}
