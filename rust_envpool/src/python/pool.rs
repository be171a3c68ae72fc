//! PyO3 edge of the env pool: `pcsd._envpool.EnvPool`. Arguments are extracted into Rust values
//! while the GIL is held; all waiting happens in [`detached`], which releases the GIL and turns a
//! Ctrl-C into KeyboardInterrupt. The typed Python API is `pcsd.envs.pool.EnvPool`.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::envs::alfworld::{AlfworldEnv, GameSpec, LoadError};
use crate::envs::dummy::{DummyConfig, DummyEnv};
use crate::envs::webshop::WebShopEnv;
use crate::envs::TextEnv;
use crate::pool::{EnvFactory, EnvPool, Op, PoolConfig, PoolError, Recycler, StepResult, MAX_ENVS};

use super::columns::{self, SharedStrs};
use super::webshop::PyWebShop;

/// One request per action: an action that is not valid text (a str with a lone surrogate,
/// which has no UTF-8 form) becomes that env's error instead of failing the whole call.
fn requests(actions: &[Bound<'_, PyString>]) -> Vec<Op> {
    actions
        .iter()
        .enumerate()
        .map(|(k, a)| match a.to_str() {
            Ok(s) => Op::Step(s.to_owned()),
            Err(e) => Op::Invalid(format!(
                "actions[{k}] is not valid text ({e}); the action was not sent to the env"
            )),
        })
        .collect()
}

/// One game of an ALFWorld pool: a `game.tw-pddl` file, or `(name, text)`: the text of such a file
/// held in memory (procedural games generated on demand, `pcsd.envs.procedural.ProceduralGame`),
/// `name` standing for its path in messages and `source`.
#[derive(FromPyObject)]
enum GameArg {
    Path(String),
    Text(String, String),
}

impl GameArg {
    fn load(&self) -> Result<GameSpec, LoadError> {
        match self {
            GameArg::Path(p) => GameSpec::from_path(p),
            GameArg::Text(name, text) => GameSpec::from_json_str(text, name),
        }
    }
}

fn pool_err(e: PoolError) -> PyErr {
    match e {
        PoolError::InvalidArgument { .. } => PyValueError::new_err(e.to_string()),
        PoolError::Interrupted => PyKeyboardInterrupt::new_err(e.to_string()),
        PoolError::Setup(m) => PyRuntimeError::new_err(m),
    }
}

/// The one path for every call that may wait: runs `f` with the GIL released. While `f` waits it
/// polls the interrupt check, which briefly re-takes the GIL to run Python's signal handlers; if a
/// handler raises (Ctrl-C: KeyboardInterrupt), `f` stops waiting and that exception is raised.
fn detached<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: Send + FnOnce(&mut dyn FnMut() -> bool) -> Result<T, PoolError>,
{
    let mut raised: Option<PyErr> = None;
    let out = py.detach(|| {
        let mut interrupted = || match Python::attach(|py| py.check_signals()) {
            Ok(()) => false,
            Err(e) => {
                raised = Some(e);
                true
            }
        };
        f(&mut interrupted)
    });
    match out {
        Ok(v) => Ok(v),
        Err(PoolError::Interrupted) => Err(raised.take().unwrap_or_else(|| pool_err(PoolError::Interrupted))),
        Err(e) => Err(pool_err(e)),
    }
}

fn int_arg(name: &str, v: i64, min: i64) -> PyResult<i64> {
    if v < min {
        return Err(PyValueError::new_err(format!("{name}: must be >= {min}, got {v}")));
    }
    Ok(v)
}

/// Builds one factory per group for the `dummy` kind from its options.
fn dummy_factories(num_groups: usize, seed: u64, options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<EnvFactory>> {
    let mut base = DummyConfig::default();
    if let Some(opts) = options {
        for (k, v) in opts.iter() {
            let key: String = k.extract()?;
            let bad = |what: &str| PyValueError::new_err(format!("{key}: expected {what}, got {v}"));
            match key.as_str() {
                "episode_len" => {
                    let x: i64 = v.extract().map_err(|_| bad("an int >= 1"))?;
                    base.episode_len = u32::try_from(int_arg(&key, x, 1)?).map_err(|_| bad("an int < 2**32"))?;
                }
                "busy_iters" => {
                    let x: i64 = v.extract().map_err(|_| bad("an int >= 0"))?;
                    base.busy_iters = int_arg(&key, x, 0)? as u64;
                }
                "panic_at_step" => {
                    base.panic_at_step = if v.is_none() {
                        None
                    } else {
                        let x: i64 = v.extract().map_err(|_| bad("None or an int >= 1"))?;
                        Some(u32::try_from(int_arg(&key, x, 1)?).map_err(|_| bad("an int < 2**32"))?)
                    };
                }
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "options: unknown option '{key}' for env kind 'dummy' (known: episode_len, \
                         busy_iters, panic_at_step)"
                    )))
                }
            }
        }
    }
    Ok((0..num_groups)
        .map(|g| {
            let cfg = Arc::new(DummyConfig {
                seed: seed.wrapping_add(g as u64),
                ..base.clone()
            });
            Box::new(move || Box::new(DummyEnv::new((*cfg).clone())) as Box<dyn TextEnv>) as EnvFactory
        })
        .collect())
}

/// A batched pool of text envs stepped on native threads (see `pcsd.envs.pool.EnvPool`).
#[pyclass(name = "EnvPool", module = "pcsd._envpool", frozen)]
pub struct PyEnvPool {
    inner: Mutex<Option<EnvPool>>,
    kind: String,
    /// The process that built the pool. Its worker threads do not survive `fork`, so a child
    /// process must build its own pool.
    pid: u32,
    /// `str` objects of admissible commands and task types (see [`columns`]). Both locks below
    /// are only taken with the GIL held and never held across Python code.
    strings: Mutex<SharedStrs>,
    /// Hands the Rust results back to be freed on the worker threads once they are converted;
    /// None once closed.
    recycler: Mutex<Option<Recycler>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PyEnvPool {
    fn with_pool<T: Send>(
        &self,
        py: Python<'_>,
        f: impl Send + FnOnce(&mut EnvPool, &mut dyn FnMut() -> bool) -> Result<T, PoolError>,
    ) -> PyResult<T> {
        self.check_process()?;
        detached(py, |interrupted| {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_mut() {
                Some(pool) => f(pool, interrupted),
                None => Err(PoolError::Setup("this EnvPool is closed".into())),
            }
        })
    }

    /// The Python columns of `results` (see [`columns`]); the Rust results are then freed on
    /// the worker threads.
    fn to_python<'py>(&self, py: Python<'py>, results: Vec<StepResult>) -> PyResult<Bound<'py, PyTuple>> {
        // The objects are taken out for the conversion, which may run Python code (a garbage
        // collection): nothing stays locked, and a call that re-enters meanwhile starts from none
        // (same strings, built anew).
        let mut strs = std::mem::take(&mut *lock(&self.strings));
        let out = columns::to_python(py, &results, &mut strs);
        *lock(&self.strings) = strs;
        match lock(&self.recycler).as_ref() {
            Some(r) => r.drop_results(results),
            None => drop(results),
        }
        out
    }

    fn check_process(&self) -> PyResult<()> {
        let now = std::process::id();
        if now != self.pid {
            return Err(PyRuntimeError::new_err(format!(
                "this EnvPool was created in process {} and its worker threads do not exist in \
                 this process ({now}, a fork child); create a new EnvPool here",
                self.pid
            )));
        }
        Ok(())
    }

    /// A quick query. The lock is taken with the GIL released: another thread may hold it while
    /// waiting in `recv`, and that wait re-takes the GIL to check for Ctrl-C.
    fn info<T: Send>(&self, py: Python<'_>, f: impl Send + FnOnce(&EnvPool) -> T) -> PyResult<T> {
        self.check_process()?;
        py.detach(|| {
            let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.as_ref().map(f)
        })
        .ok_or_else(|| PyRuntimeError::new_err("this EnvPool is closed"))
    }
}

#[pymethods]
impl PyEnvPool {
    /// kind: "dummy" (options: episode_len, busy_iters, panic_at_step); games: one entry per group
    /// for kinds that load game files (a path, or a `(name, text)` pair: the file's text in memory). num_envs = number of groups * group_size. str_cache=False:
    /// no string ids, every string is built anew (the plain path the shared strings are tested
    /// against).
    #[new]
    #[pyo3(signature = (kind, num_envs, *, group_size=1, games=None, max_steps=0, num_threads=0, auto_reset=false, seed=0, options=None, str_cache=true, shop=None, goals=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        kind: &str,
        num_envs: i64,
        group_size: i64,
        games: Option<Vec<GameArg>>,
        max_steps: i64,
        num_threads: i64,
        auto_reset: bool,
        seed: i64,
        options: Option<Bound<'_, PyDict>>,
        str_cache: bool,
        shop: Option<PyRef<'_, PyWebShop>>,
        goals: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        let num_envs = int_arg("num_envs", num_envs, 1)? as usize;
        if num_envs > MAX_ENVS {
            return Err(PyValueError::new_err(format!(
                "num_envs: at most {MAX_ENVS} envs per pool, got {num_envs}"
            )));
        }
        let group_size = int_arg("group_size", group_size, 1)? as usize;
        let max_steps = u32::try_from(int_arg("max_steps", max_steps, 0)?)
            .map_err(|_| PyValueError::new_err("max_steps: must be < 2**32"))?;
        let num_threads = int_arg("num_threads", num_threads, 0)? as usize;
        let seed = int_arg("seed", seed, 0)? as u64;
        if !num_envs.is_multiple_of(group_size) {
            return Err(PyValueError::new_err(format!(
                "num_envs: must be a multiple of group_size ({group_size}), got {num_envs}"
            )));
        }
        let num_groups = num_envs / group_size;
        if kind != "webshop" && (shop.is_some() || goals.is_some()) {
            return Err(PyValueError::new_err(format!(
                "shop/goals: only env kind 'webshop' takes them, not '{kind}'"
            )));
        }
        let factories = match kind {
            "webshop" => {
                if games.is_some() {
                    return Err(PyValueError::new_err(
                        "games: env kind 'webshop' takes goals=[goal index per group], not games",
                    ));
                }
                let shop = shop
                    .ok_or_else(|| PyValueError::new_err("shop: env kind 'webshop' needs shop=<a loaded WebShop>"))?
                    .shop
                    .clone();
                let goals = goals.ok_or_else(|| {
                    PyValueError::new_err("goals: env kind 'webshop' needs a list of goal indices, one per group")
                })?;
                if goals.len() != num_groups {
                    return Err(PyValueError::new_err(format!(
                        "goals: expected one goal index per group ({num_groups}), got {}",
                        goals.len()
                    )));
                }
                let n = shop.num_goals();
                let mut out: Vec<EnvFactory> = Vec::with_capacity(num_groups);
                for (k, &g) in goals.iter().enumerate() {
                    let g = usize::try_from(g).ok().filter(|&g| g < n).ok_or_else(|| {
                        PyValueError::new_err(format!("goals[{k}]: expected a goal index in [0, {n}), got {g}"))
                    })?;
                    let shop = shop.clone();
                    out.push(Box::new(move || {
                        Box::new(WebShopEnv::with_goal(shop.clone(), g)) as Box<dyn TextEnv>
                    }));
                }
                out
            }
            "dummy" => {
                if games.is_some() {
                    return Err(PyValueError::new_err(
                        "games: env kind 'dummy' takes no games (pass None)",
                    ));
                }
                dummy_factories(num_groups, seed, options.as_ref())?
            }
            "alfworld" => {
                let games = games.ok_or_else(|| {
                    PyValueError::new_err(
                        "games: env kind 'alfworld' needs a list of game files (paths or (name, text) pairs), one per group",
                    )
                })?;
                if games.len() != num_groups {
                    return Err(PyValueError::new_err(format!(
                        "games: expected one game per group ({num_groups}), got {}",
                        games.len()
                    )));
                }
                // The engine's own limit equals the pool's (0 = no limit): both end the episode
                // at the same step, and the pool marks it truncated.
                let engine_limit = if max_steps == 0 { usize::MAX } else { max_steps as usize };
                let specs = py
                    .detach(|| {
                        games
                            .iter()
                            .map(|g| g.load().map(Arc::new))
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(|e| PyValueError::new_err(format!("games: {e}")))?;
                specs
                    .into_iter()
                    .map(|spec| {
                        Box::new(move || Box::new(AlfworldEnv::new(spec.clone(), engine_limit)) as Box<dyn TextEnv>)
                            as EnvFactory
                    })
                    .collect()
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "kind: unknown env kind '{other}' (known: 'dummy', 'alfworld', 'webshop')"
                )))
            }
        };
        let config = PoolConfig {
            num_threads,
            group_size,
            max_steps,
            auto_reset,
            string_ids: str_cache,
        };
        let pool = detached(py, move |_| EnvPool::new(factories, config))?;
        let recycler = pool.recycler();
        Ok(Self {
            inner: Mutex::new(Some(pool)),
            kind: kind.to_owned(),
            pid: std::process::id(),
            strings: Mutex::new(SharedStrs::default()),
            recycler: Mutex::new(Some(recycler)),
        })
    }

    /// Resets the given envs; results in the order of `env_ids`.
    fn reset<'py>(&self, py: Python<'py>, env_ids: Vec<i64>) -> PyResult<Bound<'py, PyTuple>> {
        let r = self.with_pool(py, |p, i| p.reset_interruptible(&env_ids, i))?;
        self.to_python(py, r)
    }

    /// Steps the given envs; results in the order of `env_ids`.
    fn step<'py>(
        &self,
        py: Python<'py>,
        actions: Vec<Bound<'py, PyString>>,
        env_ids: Vec<i64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let ops = requests(&actions);
        let r = self.with_pool(py, |p, i| p.step_requests_interruptible(ops, &env_ids, i))?;
        self.to_python(py, r)
    }

    /// Queues steps and returns at once.
    fn send<'py>(&self, py: Python<'py>, actions: Vec<Bound<'py, PyString>>, env_ids: Vec<i64>) -> PyResult<()> {
        let ops = requests(&actions);
        self.with_pool(py, |p, _| p.send_requests(ops, &env_ids))
    }

    /// Queues resets and returns at once.
    fn send_reset(&self, py: Python<'_>, env_ids: Vec<i64>) -> PyResult<()> {
        self.with_pool(py, |p, _| p.send_reset(&env_ids))
    }

    /// The first `batch_size` requests to finish, in completion order; None: all outstanding.
    #[pyo3(signature = (batch_size=None))]
    fn recv<'py>(&self, py: Python<'py>, batch_size: Option<i64>) -> PyResult<Bound<'py, PyTuple>> {
        let n = match batch_size {
            None => None,
            Some(b) => Some(int_arg("batch_size", b, 1)? as usize),
        };
        let r = self.with_pool(py, |p, i| {
            // None with nothing outstanding asks for 1, so the error says "nothing is pending".
            let n = n.unwrap_or_else(|| p.outstanding().max(1));
            p.recv_interruptible(n, i)
        })?;
        self.to_python(py, r)
    }

    /// (task_type, task) of one env.
    fn task_of(&self, py: Python<'_>, env_id: i64) -> PyResult<(String, String)> {
        let n = self.info(py, |p| p.num_envs())?;
        let i = usize::try_from(env_id)
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| PyValueError::new_err(format!("env_id: {env_id} is out of range (ids 0..={})", n - 1)))?;
        self.with_pool(py, move |p, _| Ok(p.task_of(i).expect("id checked")))
    }

    /// Stops the pool: requests not yet started are dropped; later calls raise RuntimeError.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.check_process()?;
        let pool = py.detach(|| self.inner.lock().unwrap_or_else(|e| e.into_inner()).take());
        let recycler = lock(&self.recycler).take();
        *lock(&self.strings) = SharedStrs::default();
        py.detach(move || drop((pool, recycler)));
        Ok(())
    }

    /// Closed, or unusable because this is a fork child (checked without touching the lock,
    /// which a parent thread may have held at the fork).
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        if std::process::id() != self.pid {
            return true;
        }
        py.detach(|| self.inner.lock().map(|g| g.is_none()).unwrap_or(true))
    }

    #[getter]
    fn kind(&self) -> &str {
        &self.kind
    }

    #[getter]
    fn num_envs(&self, py: Python<'_>) -> PyResult<usize> {
        self.info(py, |p| p.num_envs())
    }

    #[getter]
    fn num_games(&self, py: Python<'_>) -> PyResult<usize> {
        self.info(py, |p| p.num_games())
    }

    #[getter]
    fn group_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.info(py, |p| p.group_size())
    }

    /// Worker threads actually running.
    #[getter]
    fn num_threads(&self, py: Python<'_>) -> PyResult<usize> {
        self.info(py, |p| p.num_threads())
    }

    #[getter]
    fn max_steps(&self, py: Python<'_>) -> PyResult<u32> {
        self.info(py, |p| p.config().max_steps)
    }

    #[getter]
    fn auto_reset(&self, py: Python<'_>) -> PyResult<bool> {
        self.info(py, |p| p.config().auto_reset)
    }

    /// Requests sent and not yet received.
    #[getter]
    fn outstanding(&self, py: Python<'_>) -> PyResult<usize> {
        self.info(py, |p| p.outstanding())
    }

    #[getter]
    fn in_flight(&self, py: Python<'_>) -> PyResult<usize> {
        self.info(py, |p| p.in_flight())
    }
}

impl Drop for PyEnvPool {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A fork child's copy: its worker threads (and any lock they held) do not exist here,
            // so tearing the pool (or the recycler's share of it) down could block forever. Leak
            // them instead.
            fn leak<T>(m: &mut Mutex<Option<T>>) {
                std::mem::forget(m.get_mut().unwrap_or_else(|e| e.into_inner()).take());
            }
            leak(&mut self.inner);
            leak(&mut self.recycler);
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEnvPool>()?;
    m.add("ENV_POOL_KINDS", vec!["dummy", "alfworld", "webshop"])?;
    m.add("MAX_ENVS", MAX_ENVS)?;
    Ok(())
}
