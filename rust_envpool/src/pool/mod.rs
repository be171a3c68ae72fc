//! The batched environment pool: N text envs stepped on the pool's own rayon thread pool.
//!
//! Model (after sail-sg/envpool):
//! * **Synchronous**: [`EnvPool::reset`] / [`EnvPool::step`] apply one request per given env id and
//!   return the results in the order of the ids.
//! * **Asynchronous**: [`EnvPool::send`] (or [`EnvPool::send_reset`]) queues requests and returns at
//!   once; [`EnvPool::recv`]`(n)` waits for the first `n` requests to *finish* and returns them in
//!   completion order, each tagged with its env id. `step` is `send` + waiting for exactly those
//!   envs; the synchronous mode is `recv(num_envs)` after sending to all envs.
//! * Each call's requests go out as one [`batch::Batch`]: env `i` is stepped by its home thread
//!   (envs are split into contiguous blocks, one per thread), which keeps an env's memory with one
//!   thread; a thread that runs out of its own requests helps with the others'.
//! * Workers write each result into the env's preallocated output slot and then post the env id
//!   on the completion board ([`completions::Completions`]), which wakes the calling thread only
//!   once as many ids are in as it waits for; the calling thread only moves ids between queues
//!   ([`queue::Tracker`]).
//! * Each env has at most one outstanding request (sent and not yet received).
//!
//! Groups: the pool is built from one env factory per game and a `group_size` G; env `i` is built
//! by factory `i / G`, so the G envs of a group play the same game with the same seed (GRPO).
//!
//! Per-env rules (auto-reset, step limit, panic isolation) are in [`slot::EnvSlot::run`].
//!
//! Errors: a request that is bad for one env (an env id out of range, a step for an env that is
//! done while auto-reset is off, a panic inside the env) yields that env's result with `error` set
//! and `done` true; the pool and the other envs carry on. A malformed call (lengths mismatch,
//! duplicate ids in one call, an env that already has a request outstanding, `recv` with too few
//! requests outstanding) returns `Err` naming the argument and changes nothing.

pub mod batch;
pub mod completions;
pub mod queue;
pub mod reference;
pub mod slot;
pub mod strings;

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::envs::TextEnv;
pub use batch::Batch;
pub use completions::Completions;
pub use queue::{Entry, Outstanding, Tracker};
pub use slot::{EnvSlot, Op, SlotRules, StepResult};
pub use strings::{StringTable, NO_ID};

/// Builds one env. The pool calls each factory once per env of its group, on worker threads.
pub type EnvFactory = Box<dyn Fn() -> Box<dyn TextEnv> + Send + Sync>;

/// Most distinct strings a pool's [`StringTable`] gives ids to (far more than the commands of
/// the games a pool plays; later ones get [`NO_ID`]).
pub const STRING_TABLE_LIMIT: usize = 1 << 18;

/// Most envs one pool holds: far above any rollout (thousands), low enough that a typo such as
/// `num_envs=10**8` is refused instead of allocating until the process is killed.
pub const MAX_ENVS: usize = 1 << 20;

/// How often a blocked `recv`/`step` calls its interrupt check.
pub const INTERRUPT_POLL: Duration = Duration::from_millis(50);

/// Pool settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Worker threads of the pool's own rayon pool; 0: one per core (or `RAYON_NUM_THREADS`).
    pub num_threads: usize,
    /// Envs per game (GRPO group size), >= 1.
    pub group_size: usize,
    /// Per-env step limit (truncation); 0: none.
    pub max_steps: u32,
    /// The auto-reset rule of [`slot::EnvSlot::run`]; off: finished envs wait for a `reset`.
    pub auto_reset: bool,
    /// Give admissible commands and task types ids in a [`StringTable`] on the worker threads
    /// (`StepResult::string_ids`), for callers that share one object per distinct string.
    pub string_ids: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            num_threads: 0,
            group_size: 1,
            max_steps: 0,
            auto_reset: false,
            string_ids: false,
        }
    }
}

/// A call the pool refused, or a wait that was interrupted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolError {
    /// A malformed call; nothing was changed. `arg` names the offending argument.
    #[error("{arg}: {msg}")]
    InvalidArgument { arg: &'static str, msg: String },
    /// The interrupt check asked a blocked wait to stop. Requests stay outstanding; `recv` them later.
    #[error("interrupted while waiting for env results; the outstanding requests stay in the pool")]
    Interrupted,
    /// The worker threads could not be started, or an env factory panicked.
    #[error("{0}")]
    Setup(String),
}

impl PoolError {
    pub(crate) fn arg(arg: &'static str, msg: impl Into<String>) -> Self {
        PoolError::InvalidArgument { arg, msg: msg.into() }
    }
}

struct Cell {
    slot: EnvSlot,
    /// The preallocated output slot the worker writes into.
    output: Option<StepResult>,
}

struct Shared {
    cells: Vec<Mutex<Cell>>,
    rules: SlotRules,
    closing: AtomicBool,
    /// Where workers post finished env ids.
    done: Completions,
    /// With `PoolConfig::string_ids`.
    strings: Option<StringTable>,
    /// Per worker thread: results handed back by a [`Recycler`], freed by that thread.
    husks: Vec<Mutex<Vec<StepResult>>>,
}

impl Shared {
    /// Applies `op` to env `env` on a worker thread: the result goes to the env's output slot
    /// and the env id to the completion board.
    fn run(&self, env: usize, op: &Op) {
        if self.closing.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut cell = lock(&self.cells[env]);
            let rules = self.rules;
            let mut result = catch_unwind(AssertUnwindSafe(|| cell.slot.run(op, rules))).unwrap_or_else(|_| {
                StepResult::failed(
                    env as i64,
                    format!("env {env}: internal panic while reporting its result"),
                    0.0,
                    String::new(),
                    0,
                )
            });
            if let Some(table) = &self.strings {
                let texts = result.admissible.iter().chain([&result.task_type]);
                result.string_ids = Some(table.ids(texts.map(String::as_str)));
            }
            cell.output = Some(result);
        }
        self.done.post(env);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Env panics are caught inside the lock, so poisoning means a bug elsewhere; the data is
    // still consistent (the slot records the panic), so carry on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Paces the interrupt check of a blocked wait: due once per [`INTERRUPT_POLL`], whether results
/// trickle in or not (a steady trickle must not make a long wait uninterruptible).
struct Poll(Instant);

impl Poll {
    fn new() -> Self {
        Poll(Instant::now())
    }

    fn due(&mut self) -> bool {
        if self.0.elapsed() >= INTERRUPT_POLL {
            self.0 = Instant::now();
            true
        } else {
            false
        }
    }
}

/// The worker thread an env calls home: envs are split into one contiguous block per thread
/// (the envs of a group, which share their game, mostly on one thread).
fn home(env: usize, num_envs: usize, threads: usize) -> usize {
    env * threads / num_envs.max(1)
}

/// Hands results back to a pool to be freed on its worker threads, each on its env's home
/// thread (where its memory came from), when they start on the next call's requests: freeing
/// what a call handed out (~20 strings per env) is then neither serial work of the calling
/// thread nor a wake-up of the workers while it converts the results.
#[derive(Clone)]
pub struct Recycler {
    shared: Arc<Shared>,
    num_envs: usize,
}

impl Recycler {
    pub fn drop_results(&self, results: Vec<StepResult>) {
        let k = self.shared.husks.len();
        let mut parts: Vec<Vec<StepResult>> = (0..k).map(|_| Vec::new()).collect();
        for r in results {
            let env = usize::try_from(r.env_id).unwrap_or(0).min(self.num_envs - 1);
            parts[home(env, self.num_envs, k)].push(r);
        }
        for (husks, part) in self.shared.husks.iter().zip(parts) {
            lock(husks).extend(part);
        }
    }
}

/// The threaded pool (see the module docs).
pub struct EnvPool {
    shared: Arc<Shared>,
    threads: Arc<rayon::ThreadPool>,
    tracker: Tracker,
    config: PoolConfig,
    num_games: usize,
}

/// Validates one call's env ids: the same length as the per-env payload, no duplicates, and no
/// in-range env with a request outstanding. Returns the in-range ids as indices (`None`: out of range).
fn check_call(
    payload_arg: &'static str,
    payload_len: usize,
    env_ids: &[i64],
    num_envs: usize,
    tracker: &Tracker,
) -> Result<Vec<Option<usize>>, PoolError> {
    if payload_len != env_ids.len() {
        return Err(PoolError::arg(
            payload_arg,
            format!(
                "expected one entry per env id ({} env ids), got {payload_len}",
                env_ids.len()
            ),
        ));
    }
    let mut seen = HashSet::with_capacity(env_ids.len());
    let mut out = Vec::with_capacity(env_ids.len());
    for &id in env_ids {
        if !seen.insert(id) {
            return Err(PoolError::arg(
                "env_ids",
                format!("env id {id} appears more than once in one call"),
            ));
        }
        let idx = usize::try_from(id).ok().filter(|&i| i < num_envs);
        if let Some(i) = idx {
            if tracker.state(i) != Outstanding::Idle {
                return Err(PoolError::arg(
                    "env_ids",
                    format!(
                        "env {i} already has a request outstanding (in flight or waiting to be \
                         received); recv it before sending to it again"
                    ),
                ));
            }
        }
        out.push(idx);
    }
    Ok(out)
}

pub(crate) fn out_of_range(id: i64, num_envs: usize) -> StepResult {
    StepResult::failed(
        id,
        format!(
            "env id {id} is out of range: the pool has {num_envs} envs (ids 0..={})",
            num_envs - 1
        ),
        0.0,
        String::new(),
        0,
    )
}

impl EnvPool {
    /// Builds `factories.len() * config.group_size` envs (env `i` from factory `i / group_size`)
    /// on a new thread pool. The envs start un-reset: call [`EnvPool::reset`] (or step with
    /// auto-reset on) first.
    pub fn new(factories: Vec<EnvFactory>, config: PoolConfig) -> Result<Self, PoolError> {
        if factories.is_empty() {
            return Err(PoolError::arg("games", "need at least one game (env factory)"));
        }
        if config.group_size == 0 {
            return Err(PoolError::arg("group_size", "must be >= 1"));
        }
        let num_envs = factories.len().saturating_mul(config.group_size);
        if num_envs > MAX_ENVS {
            return Err(PoolError::arg(
                "num_envs",
                format!("at most {MAX_ENVS} envs per pool, got {num_envs}"),
            ));
        }
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(config.num_threads)
            .thread_name(|i| format!("pcsd-envpool-{i}"))
            // Env panics are caught per request; this only guards against a bug in the pool
            // itself aborting the process (rayon's default for a panicking `spawn`).
            .panic_handler(|p| {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                eprintln!("pcsd envpool: internal panic in a worker task: {msg}");
            })
            .build()
            .map_err(|e| PoolError::Setup(format!("could not start the pool's threads: {e}")))?;
        let g = config.group_size;
        let envs: Vec<Result<Box<dyn TextEnv>, String>> = threads.install(|| {
            (0..num_envs)
                .into_par_iter()
                .map(|i| {
                    catch_unwind(AssertUnwindSafe(|| factories[i / g]()))
                        .map_err(|_| format!("the env factory of game {} panicked while building env {i}", i / g))
                })
                .collect()
        });
        let mut cells = Vec::with_capacity(num_envs);
        for (i, env) in envs.into_iter().enumerate() {
            let env = env.map_err(PoolError::Setup)?;
            cells.push(Mutex::new(Cell {
                slot: EnvSlot::new(i, env),
                output: None,
            }));
        }
        let shared = Arc::new(Shared {
            cells,
            rules: SlotRules {
                max_steps: config.max_steps,
                auto_reset: config.auto_reset,
            },
            closing: AtomicBool::new(false),
            done: Completions::default(),
            strings: config.string_ids.then(|| StringTable::new(STRING_TABLE_LIMIT)),
            husks: (0..threads.current_num_threads()).map(|_| Mutex::default()).collect(),
        });
        Ok(Self {
            shared,
            threads: Arc::new(threads),
            tracker: Tracker::new(num_envs),
            config,
            num_games: factories.len(),
        })
    }

    pub fn num_envs(&self) -> usize {
        self.shared.cells.len()
    }

    pub fn num_games(&self) -> usize {
        self.num_games
    }

    pub fn group_size(&self) -> usize {
        self.config.group_size
    }

    pub fn config(&self) -> PoolConfig {
        self.config
    }

    /// Worker threads actually running.
    pub fn num_threads(&self) -> usize {
        self.threads.current_num_threads()
    }

    /// The table behind `StepResult::string_ids` (with `PoolConfig::string_ids`).
    pub fn string_table(&self) -> Option<&StringTable> {
        self.shared.strings.as_ref()
    }

    /// A handle that hands results back to be freed on this pool's worker threads.
    pub fn recycler(&self) -> Recycler {
        Recycler {
            shared: Arc::clone(&self.shared),
            num_envs: self.num_envs(),
        }
    }

    /// Requests sent and not yet received.
    pub fn outstanding(&self) -> usize {
        self.tracker.outstanding()
    }

    /// Requests still being worked on.
    pub fn in_flight(&self) -> usize {
        self.tracker.in_flight()
    }

    /// Task type and task description of env `env` (waits if the env has a request in flight).
    pub fn task_of(&self, env: usize) -> Option<(String, String)> {
        self.shared.cells.get(env).map(|c| {
            let c = lock(c);
            (c.slot.task_type(), c.slot.task())
        })
    }

    /// Sends `requests` (env index, op) to the workers as one batch (see [`batch`]).
    fn dispatch(&mut self, requests: Vec<(usize, Op)>) {
        if requests.is_empty() {
            return;
        }
        for (env, _) in &requests {
            self.tracker.start(*env);
        }
        let (n, k) = (self.num_envs(), self.threads.current_num_threads());
        let batch = Arc::new(Batch::new(requests, k, |(env, _)| home(*env, n, k)));
        let shared = Arc::clone(&self.shared);
        self.threads.spawn_broadcast(move |ctx| {
            drop(std::mem::take(&mut *lock(&shared.husks[ctx.index()])));
            batch.run(ctx.index(), |(env, op)| shared.run(*env, op));
        });
    }

    fn take_output(&self, env: usize) -> StepResult {
        lock(&self.shared.cells[env]).output.take().unwrap_or_else(|| {
            StepResult::failed(
                env as i64,
                format!("env {env}: internal error: finished without writing a result"),
                0.0,
                String::new(),
                0,
            )
        })
    }

    /// Moves finished env ids from the completion board to the tracker, waiting at most `timeout`
    /// for `want` of them (the caller can make no progress with fewer). Returns the ids moved.
    fn pump(&mut self, want: usize, timeout: Duration, moved: &mut Vec<usize>) {
        self.shared.done.wait(want, timeout, moved);
        for &i in moved.iter() {
            self.tracker.complete(i);
        }
    }

    /// Queues a step for each `(action, env id)` pair and returns at once. Results come back
    /// through [`EnvPool::recv`].
    pub fn send(&mut self, actions: Vec<String>, env_ids: &[i64]) -> Result<(), PoolError> {
        self.send_ops(actions.into_iter().map(Op::Step).collect(), "actions", env_ids)
    }

    /// Queues one request per env id ([`Op::Step`], or [`Op::Invalid`] for an action rejected
    /// before it reached the env) and returns at once.
    pub fn send_requests(&mut self, ops: Vec<Op>, env_ids: &[i64]) -> Result<(), PoolError> {
        self.send_ops(ops, "actions", env_ids)
    }

    /// [`EnvPool::step_interruptible`] with requests instead of action strings.
    pub fn step_requests_interruptible(
        &mut self,
        ops: Vec<Op>,
        env_ids: &[i64],
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<StepResult>, PoolError> {
        self.run_sync(ops, "actions", env_ids, interrupted)
    }

    /// Queues a reset for each env id and returns at once.
    pub fn send_reset(&mut self, env_ids: &[i64]) -> Result<(), PoolError> {
        self.send_ops(vec![Op::Reset; env_ids.len()], "env_ids", env_ids)
    }

    fn send_ops(&mut self, ops: Vec<Op>, arg: &'static str, env_ids: &[i64]) -> Result<(), PoolError> {
        let n = self.num_envs();
        let idx = check_call(arg, ops.len(), env_ids, n, &self.tracker)?;
        let mut requests = Vec::with_capacity(ops.len());
        for ((op, id), i) in ops.into_iter().zip(env_ids).zip(idx) {
            match i {
                Some(i) => requests.push((i, op)),
                None => self.tracker.push_rejected(out_of_range(*id, n)),
            }
        }
        self.dispatch(requests);
        Ok(())
    }

    /// Waits for the first `batch_size` outstanding requests to finish and returns them in
    /// completion order. Requests rejected at `send` (out-of-range ids) count as finished when sent.
    pub fn recv(&mut self, batch_size: usize) -> Result<Vec<StepResult>, PoolError> {
        self.recv_interruptible(batch_size, &mut || false)
    }

    /// [`EnvPool::recv`] that calls `interrupted` every [`INTERRUPT_POLL`] while it waits and
    /// returns [`PoolError::Interrupted`] when it answers true (nothing is lost: the requests stay
    /// outstanding).
    pub fn recv_interruptible(
        &mut self,
        batch_size: usize,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<StepResult>, PoolError> {
        if batch_size == 0 {
            return Err(PoolError::arg("batch_size", "must be >= 1"));
        }
        let outstanding = self.tracker.outstanding();
        if batch_size > outstanding {
            let msg = if outstanding == 0 {
                format!("asked for {batch_size} results but nothing is pending; send requests first")
            } else {
                format!("asked for {batch_size} results but only {outstanding} requests are outstanding")
            };
            return Err(PoolError::arg("batch_size", msg));
        }
        let mut moved = Vec::new();
        let mut poll = Poll::new();
        while self.tracker.ready_len() < batch_size {
            let want = batch_size - self.tracker.ready_len();
            self.pump(want, INTERRUPT_POLL, &mut moved);
            if self.tracker.ready_len() < batch_size && poll.due() && interrupted() {
                return Err(PoolError::Interrupted);
            }
        }
        Ok(self
            .tracker
            .pop_front(batch_size)
            .into_iter()
            .map(|e| match e {
                Entry::Env(i) => self.take_output(i),
                Entry::Rejected(r) => *r,
            })
            .collect())
    }

    /// Steps each env id with its action and returns the results in the order of `env_ids`.
    pub fn step(&mut self, actions: Vec<String>, env_ids: &[i64]) -> Result<Vec<StepResult>, PoolError> {
        self.step_interruptible(actions, env_ids, &mut || false)
    }

    /// Resets each env id and returns the results in the order of `env_ids`.
    pub fn reset(&mut self, env_ids: &[i64]) -> Result<Vec<StepResult>, PoolError> {
        self.reset_interruptible(env_ids, &mut || false)
    }

    pub fn step_interruptible(
        &mut self,
        actions: Vec<String>,
        env_ids: &[i64],
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<StepResult>, PoolError> {
        self.run_sync(
            actions.into_iter().map(Op::Step).collect(),
            "actions",
            env_ids,
            interrupted,
        )
    }

    pub fn reset_interruptible(
        &mut self,
        env_ids: &[i64],
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<StepResult>, PoolError> {
        self.run_sync(vec![Op::Reset; env_ids.len()], "env_ids", env_ids, interrupted)
    }

    /// `send` + waiting for exactly these envs. If interrupted, the envs stay outstanding and
    /// their results come back through `recv`.
    fn run_sync(
        &mut self,
        ops: Vec<Op>,
        arg: &'static str,
        env_ids: &[i64],
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<StepResult>, PoolError> {
        let n = self.num_envs();
        let idx = check_call(arg, ops.len(), env_ids, n, &self.tracker)?;
        let mut wanted = vec![false; n];
        let mut requests = Vec::with_capacity(ops.len());
        for (op, i) in ops.into_iter().zip(&idx) {
            if let Some(i) = *i {
                wanted[i] = true;
                requests.push((i, op));
            }
        }
        let mut remaining = requests.len();
        self.dispatch(requests);
        let mut moved = Vec::new();
        let mut poll = Poll::new();
        while remaining > 0 {
            self.pump(remaining, INTERRUPT_POLL, &mut moved);
            remaining -= moved.iter().filter(|&&i| wanted[i]).count();
            if remaining > 0 && poll.due() && interrupted() {
                return Err(PoolError::Interrupted);
            }
        }
        self.tracker.take_envs(&wanted);
        Ok(env_ids
            .iter()
            .zip(idx)
            .map(|(id, i)| match i {
                Some(i) => self.take_output(i),
                None => out_of_range(*id, n),
            })
            .collect())
    }
}

impl Drop for EnvPool {
    fn drop(&mut self) {
        // Queued requests that have not started are skipped; running ones finish on their own.
        self.shared.closing.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
