//! PyO3 wrapper of the native WebShop (`pcsd._envpool.WebShop`, `WebShopEnv`); the typed Python
//! API is `pcsd.envs.webshop`.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::create_exception;
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::envs::webshop::slots::{Placement, Slots};
use crate::envs::webshop::{
    CachePolicy, Goal, GoalOptions, GoalSet, Shop, ShopConfig, ShopFiles, StartedGoal, Variant, WebShopEnv,
    WebShopError, WebShopStep,
};

create_exception!(
    _envpool,
    WebShopStepError,
    PyRuntimeError,
    "A WebShop step where the original engine raises (its exception type starts the message)."
);

fn type_name(x: &Bound<'_, PyAny>) -> String {
    x.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

pub(crate) fn webshop_err(e: WebShopError) -> PyErr {
    match e {
        WebShopError::Load(m) if m.contains("No such file") => PyFileNotFoundError::new_err(m),
        WebShopError::Load(m) => PyValueError::new_err(m),
        WebShopError::Argument(m) => PyValueError::new_err(m),
        e @ WebShopError::Step { .. } => WebShopStepError::new_err(e.to_string()),
    }
}

/// One loaded shop (catalogue, index, goals), shared read-only by its envs.
#[pyclass(name = "WebShop", module = "pcsd._envpool", frozen)]
pub struct PyWebShop {
    pub(crate) shop: Arc<Shop>,
    goal_dicts: Arc<GoalDicts>,
}

/// What a shop's envs keep of the goals started recently (a group of envs resets to the same
/// goal), by goal index: its goal dict and the page `reset(goal)` shows (the same for every env
/// of the shop), as Python objects. Each caller gets copies whose containers are its own (the
/// strings and numbers are shared).
struct GoalDicts {
    slots: Slots<GoalEntry>,
}

impl Default for GoalDicts {
    fn default() -> Self {
        GoalDicts {
            slots: Slots::new(GOAL_DICTS, Placement::Direct),
        }
    }
}

/// Slots of [`GoalDicts`] (goal `i` is in set `i % (GOAL_DICTS / 2)`, of two slots).
const GOAL_DICTS: usize = 4096;

/// One goal kept by [`GoalDicts`]; a clone shares its parts.
#[derive(Clone)]
struct GoalEntry {
    goal: Arc<GoalObjects>,
    /// Made on the first `reset(index)` (None until then).
    reset: Option<Arc<ResetObjects>>,
}

/// A goal dict to copy from, with its `attributes` list and `goal_options` container at hand.
struct GoalObjects {
    dict: Py<PyDict>,
    attributes: Py<PyAny>,
    options: Py<PyAny>,
    /// Where the objects a copy touches lie (see [`prefetch`]).
    touch: Vec<usize>,
}

/// `reset(index)`'s result to copy from: the observation (a str, shared), the info dict and its
/// `available_actions` dict with their containers left to fill, the clickables; and the goal as
/// the envs play it.
struct ResetObjects {
    started: Arc<StartedGoal>,
    obs: Py<PyString>,
    info: Py<PyDict>,
    available_actions: Py<PyDict>,
    clickables: Py<PyList>,
    /// Where the objects a copy touches lie (see [`prefetch`]).
    touch: Vec<usize>,
}

/// Where a container and the items a copy of it holds lie (read through borrowed references:
/// no count is raised).
fn touch_of(v: &Bound<'_, PyAny>, out: &mut Vec<usize>) {
    use pyo3::ffi;
    out.push(v.as_ptr() as usize);
    if let Ok(l) = v.cast::<PyList>() {
        for i in 0..l.len() {
            // SAFETY: `l` is a list held by the caller and `i` is below its length.
            out.push(unsafe { ffi::PyList_GetItem(l.as_ptr(), i as ffi::Py_ssize_t) } as usize);
        }
    } else if let Ok(d) = v.cast::<PyDict>() {
        let (mut pos, mut key, mut value): (ffi::Py_ssize_t, *mut ffi::PyObject, *mut ffi::PyObject) =
            (0, std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: `d` is a dict held by the caller and not changed while stepped through;
        // PyDict_Next hands out borrowed references.
        while unsafe { ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut key, &mut value) } != 0 {
            out.extend([key as usize, value as usize]);
        }
    }
}

/// A copy of a list or dict (a shallow one: its own container, the same items).
fn copy_container<'py>(v: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if let Ok(l) = v.cast::<PyList>() {
        Ok(l.get_slice(0, l.len()).into_any())
    } else if let Ok(o) = v.cast::<PyDict>() {
        Ok(o.copy()?.into_any())
    } else {
        Ok(v.clone())
    }
}

impl GoalObjects {
    fn new(py: Python<'_>, g: &Goal) -> PyResult<GoalObjects> {
        let d = goal_to_dict(py, g)?;
        let attributes = d.get_item(intern!(py, "attributes"))?.expect("set");
        let options = d.get_item(intern!(py, "goal_options"))?.expect("set");
        let mut touch = Vec::with_capacity(32);
        touch_of(d.as_any(), &mut touch);
        touch_of(&attributes, &mut touch);
        touch_of(&options, &mut touch);
        Ok(GoalObjects {
            dict: d.unbind(),
            attributes: attributes.unbind(),
            options: options.unbind(),
            touch,
        })
    }

    /// A copy of the goal dict: the dict, its attribute list and its options its own.
    fn copy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = self.dict.bind(py).copy()?;
        d.set_item(intern!(py, "attributes"), copy_container(self.attributes.bind(py))?)?;
        d.set_item(intern!(py, "goal_options"), copy_container(self.options.bind(py))?)?;
        Ok(d)
    }
}

impl ResetObjects {
    /// The objects of the page `env` shows just after `reset(i)` (the keys in `info`'s order).
    fn new(py: Python<'_>, env: &WebShopEnv) -> PyResult<ResetObjects> {
        let clickables = PyList::new(py, env.clickable_names())?;
        let a = PyDict::new(py);
        a.set_item(intern!(py, "has_search_bar"), env.has_search_bar())?;
        a.set_item(intern!(py, "clickables"), py.None())?;
        let d = PyDict::new(py);
        d.set_item(intern!(py, "available_actions"), py.None())?;
        d.set_item(intern!(py, "url"), env.url())?;
        d.set_item(intern!(py, "goal"), py.None())?;
        d.set_item(intern!(py, "goal_index"), env.goal_index())?;
        let obs = PyString::new(py, env.obs());
        let started = env.started_goal().clone();
        let mut touch = Vec::with_capacity(16);
        touch.extend([Arc::as_ptr(&started) as usize, obs.as_ptr() as usize]);
        for x in [d.as_any(), a.as_any(), clickables.as_any()] {
            touch_of(x, &mut touch);
        }
        Ok(ResetObjects {
            started,
            obs: obs.unbind(),
            info: d.unbind(),
            available_actions: a.unbind(),
            clickables: clickables.unbind(),
            touch,
        })
    }

    /// A copy of `reset`'s info, holding `goal`: the dict, `available_actions` and clickables its own.
    fn info<'py>(&self, py: Python<'py>, goal: Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
        let a = self.available_actions.bind(py).copy()?;
        let clickables = self.clickables.bind(py);
        a.set_item(intern!(py, "clickables"), clickables.get_slice(0, clickables.len()))?;
        let d = self.info.bind(py).copy()?;
        d.set_item(intern!(py, "available_actions"), a)?;
        d.set_item(intern!(py, "goal"), goal)?;
        Ok(d)
    }
}

/// Asks the cache for the lines at `addrs`, all at once, before they are used one by one: a reset
/// right after an episode finds its kept objects out of the cache, and raising their counts one
/// after another would wait for each line in turn. A hint only: nothing at `addrs` is read.
#[inline]
fn prefetch(addrs: &[usize]) {
    #[cfg(target_arch = "x86_64")]
    for &a in addrs {
        // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(a as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addrs;
}

impl GoalDicts {
    /// The goal objects of goal `i` of `shop` (`goal`: that goal, when at hand), made and kept
    /// when missing.
    fn goal_objects(&self, py: Python<'_>, shop: &Shop, i: usize, goal: Option<&Goal>) -> PyResult<Arc<GoalObjects>> {
        if let Some(g) = self.slots.with(i as u64, |e| e.goal.clone()) {
            return Ok(g);
        }
        // made outside the lock (making Python objects can run arbitrary code through the GC)
        let g = Arc::new(match goal {
            Some(g) => GoalObjects::new(py, g)?,
            None => GoalObjects::new(py, &shop.goal(i))?,
        });
        self.slots.put(
            i as u64,
            GoalEntry {
                goal: g.clone(),
                reset: None,
            },
        );
        Ok(g)
    }

    /// A copy of the goal dict of goal `i` of `shop`.
    fn get<'py>(&self, py: Python<'py>, shop: &Shop, i: usize, goal: Option<&Goal>) -> PyResult<Bound<'py, PyDict>> {
        self.goal_objects(py, shop, i, goal)?.copy(py)
    }

    /// The first `reset(i)` since goal `i` was kept (or pushed out): the env resets the plain
    /// way, and the objects its copies come from are made and kept. Out of line: the path taken
    /// on every other reset stays short in the instruction cache.
    #[cold]
    #[inline(never)]
    fn first_reset(
        &self,
        py: Python<'_>,
        env: &mut WebShopEnv,
        i: usize,
    ) -> PyResult<(Arc<GoalObjects>, Arc<ResetObjects>)> {
        env.reset_in_place(i).map_err(webshop_err)?;
        let goal = self.goal_objects(py, env.shop(), i, Some(env.goal()))?;
        let page = Arc::new(ResetObjects::new(py, env)?);
        // kept with its goal, unless another goal took the slot meanwhile
        self.slots.with(i as u64, |e| e.reset = Some(page.clone()));
        Ok((goal, page))
    }

    /// `reset(i)` of `env` -> `(obs, info)`, copied from the objects kept for goal `i` (made from
    /// the env on the first reset to it: the page of `reset(i)` is the same for every env of the
    /// shop).
    fn reset<'py>(
        &self,
        py: Python<'py>,
        env: &mut WebShopEnv,
        i: usize,
    ) -> PyResult<(Bound<'py, PyString>, Bound<'py, PyDict>)> {
        let (goal, page) = match self.slots.get(i as u64) {
            Some(GoalEntry {
                goal,
                reset: Some(page),
            }) => {
                prefetch(&page.touch);
                prefetch(&goal.touch);
                env.reset_started(i, page.started.clone()).map_err(webshop_err)?;
                (goal, page)
            }
            _ => self.first_reset(py, env, i)?,
        };
        let info = page.info(py, goal.copy(py)?)?;
        Ok((page.obs.bind(py).clone(), info))
    }
}

/// The original's goal dict of a goal.
fn goal_to_dict<'py>(py: Python<'py>, g: &Goal) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(intern!(py, "asin"), &g.asin)?;
    d.set_item(intern!(py, "instruction_text"), &g.instruction_text)?;
    d.set_item(intern!(py, "attributes"), &g.attributes)?;
    match &g.goal_options {
        GoalOptions::Dict(items) => {
            let o = PyDict::new(py);
            for (k, v) in items {
                o.set_item(k, v)?;
            }
            d.set_item(intern!(py, "goal_options"), o)?;
        }
        GoalOptions::List(l) => d.set_item(intern!(py, "goal_options"), l)?,
    }
    if g.price_upper_is_int {
        d.set_item(intern!(py, "price_upper"), g.price_upper as i64)?;
    } else {
        d.set_item(intern!(py, "price_upper"), g.price_upper)?;
    }
    if g.weight_is_int {
        d.set_item(intern!(py, "weight"), g.weight as i64)?;
    } else {
        d.set_item(intern!(py, "weight"), g.weight)?;
    }
    d.set_item(intern!(py, "name"), &g.name)?;
    d.set_item(intern!(py, "query"), &g.query)?;
    d.set_item(intern!(py, "category"), &g.category)?;
    d.set_item(intern!(py, "product_category"), &g.product_category)?;
    Ok(d)
}

#[pymethods]
impl PyWebShop {
    /// Loads a shop (GIL released while reading and indexing). `cache`: the index cache's
    /// `WEBSHOP_CACHE` value (None or "": beside the data, else the user's cache folder; "off":
    /// none; else a folder).
    #[staticmethod]
    #[pyo3(signature = (data_dir, goals = "synthetic", seed = 0, variant = "upstream", show_attrs = false, num_products = None, nouns = None, cache = None))]
    #[allow(clippy::too_many_arguments)]
    fn load(
        py: Python<'_>,
        data_dir: PathBuf,
        goals: &str,
        seed: i64,
        variant: &str,
        show_attrs: bool,
        num_products: Option<i64>,
        nouns: Option<PathBuf>,
        cache: Option<String>,
    ) -> PyResult<Self> {
        let goals = match goals {
            "synthetic" => GoalSet::Synthetic,
            "human" => GoalSet::Human,
            other => {
                return Err(PyValueError::new_err(format!(
                    "goals: expected 'synthetic' or 'human', got {other:?}"
                )))
            }
        };
        let variant = match variant {
            "upstream" => Variant::Upstream,
            "verl" => Variant::Verl,
            other => {
                return Err(PyValueError::new_err(format!(
                    "variant: expected 'upstream' or 'verl', got {other:?}"
                )))
            }
        };
        let num_products = match num_products {
            None => None,
            Some(n) if n >= 1 => Some(n as usize),
            Some(n) => {
                return Err(PyValueError::new_err(format!(
                    "num_products: expected None or an int >= 1, got {n}"
                )))
            }
        };
        if !data_dir.is_dir() {
            return Err(PyFileNotFoundError::new_err(format!(
                "data_dir: expected a folder holding items_shuffle_1000.json, got {} (not a folder)",
                data_dir.display()
            )));
        }
        let mut files = ShopFiles::locate(&data_dir).map_err(webshop_err)?;
        if let Some(n) = nouns {
            files.nouns = n;
        }
        let config = ShopConfig {
            goals,
            seed,
            variant,
            show_attrs,
            num_products,
        };
        let policy = CachePolicy::parse(cache.as_deref());
        let shop = py.detach(|| Shop::open(&files, config, &policy)).map_err(webshop_err)?;
        Ok(Self {
            shop: Arc::new(shop),
            goal_dicts: Default::default(),
        })
    }

    /// The index cache file the shop is mapped from (None: built and held in memory).
    #[getter]
    fn cache_path(&self) -> Option<String> {
        self.shop.cache.path.as_ref().map(|p| p.to_string_lossy().into_owned())
    }

    /// Whether the load read the index cache (False: it built the image).
    #[getter]
    fn cache_hit(&self) -> bool {
        self.shop.cache.hit
    }

    /// One line per thing the load has to tell (a stale or damaged cache rebuilt, a folder that
    /// could not take the cache).
    #[getter]
    fn cache_notes(&self) -> Vec<String> {
        self.shop.cache.notes.clone()
    }

    #[getter]
    fn num_goals(&self) -> usize {
        self.shop.num_goals()
    }

    #[getter]
    fn num_products(&self) -> usize {
        self.shop.catalog.products.len()
    }

    /// Every product's ASIN, in catalogue order (as the pages show them; clickables lower-case them).
    #[getter]
    fn product_ids(&self) -> Vec<String> {
        self.shop.catalog.products.iter().map(|p| p.asin.clone()).collect()
    }

    #[getter]
    fn show_attrs(&self) -> bool {
        self.shop.config.show_attrs
    }

    #[getter]
    fn variant(&self) -> &'static str {
        match self.shop.config.variant {
            Variant::Upstream => "upstream",
            Variant::Verl => "verl",
        }
    }

    #[getter]
    fn goal_set(&self) -> &'static str {
        match self.shop.config.goals {
            GoalSet::Synthetic => "synthetic",
            GoalSet::Human => "human",
        }
    }

    #[getter]
    fn seed(&self) -> i64 {
        self.shop.config.seed
    }

    /// The goal dict of goal `index` (the original's keys).
    fn goal<'py>(&self, py: Python<'py>, index: i64) -> PyResult<Bound<'py, PyDict>> {
        let n = self.shop.num_goals();
        let i = usize::try_from(index)
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| PyValueError::new_err(format!("index: expected an int in [0, {n}), got {index}")))?;
        self.goal_dicts.get(py, &self.shop, i, None)
    }

    /// The price the reward compares with the goal's upper bound, per ASIN.
    fn product_price(&self, asin: &str) -> PyResult<f64> {
        self.shop
            .catalog
            .by_asin
            .get(asin)
            .map(|&i| self.shop.prices[i])
            .ok_or_else(|| PyValueError::new_err(format!("asin: no product {asin:?} in this shop")))
    }

    /// Search results (ASINs, best first) for a query, as the results page lists them.
    fn search(&self, py: Python<'_>, query: &str) -> PyResult<Vec<String>> {
        let shop = self.shop.clone();
        let q = query.to_string();
        let kw: Vec<String> = q.split(' ').map(str::to_string).collect();
        let mut rng = crate::envs::webshop::pyrandom::PyRandom::new(0);
        let idx = py.detach(|| shop.top_products(&kw, &mut rng)).map_err(webshop_err)?;
        Ok(idx
            .into_iter()
            .map(|i| self.shop.catalog.products[i].asin.clone())
            .collect())
    }

    /// The exhaustive search's hits (every matching posting scored: the reference the pruned
    /// search of `search` is checked against), as ASINs best first. Keywords such as `<r>` are
    /// not interpreted.
    fn search_reference(&self, py: Python<'_>, query: &str) -> PyResult<Vec<String>> {
        let shop = self.shop.clone();
        let q = query.to_string();
        let idx = py.detach(|| shop.search_reference(&q)).map_err(webshop_err)?;
        Ok(idx
            .into_iter()
            .map(|i| self.shop.catalog.products[i].asin.clone())
            .collect())
    }

    /// A new env on this shop.
    fn env(&self) -> PyWebShopEnv {
        PyWebShopEnv {
            env: self.shop.env(),
            goal_dicts: self.goal_dicts.clone(),
        }
    }
}

/// One browser session on a shop.
#[pyclass(name = "WebShopEnv", module = "pcsd._envpool")]
pub struct PyWebShopEnv {
    env: WebShopEnv,
    goal_dicts: Arc<GoalDicts>,
}

/// `reset`'s `goal_index` as an index below `n` (an int, not a bool), else one line naming it.
#[inline]
fn goal_index_arg(g: &Bound<'_, PyAny>, n: usize) -> PyResult<usize> {
    if g.is_exact_instance_of::<pyo3::types::PyInt>() {
        if let Ok(i) = g.extract::<usize>() {
            if i < n {
                return Ok(i);
            }
        }
    }
    goal_index_refused(g, n)
}

/// Why `goal_index` is refused (or the index, for a subclass of int other than bool).
#[cold]
#[inline(never)]
fn goal_index_refused(g: &Bound<'_, PyAny>, n: usize) -> PyResult<usize> {
    if g.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err("goal_index: expected an int, got bool"));
    }
    if !g.is_instance_of::<pyo3::types::PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "goal_index: expected an int, got {}",
            type_name(g)
        )));
    }
    let i: i64 = g
        .extract()
        .map_err(|_| PyValueError::new_err(format!("goal_index: expected an int in [0, {n}), got {g}")))?;
    usize::try_from(i)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| PyValueError::new_err(format!("goal_index: expected an int in [0, {n}), got {i}")))
}

fn info<'py>(py: Python<'py>, s: &WebShopStep) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let a = PyDict::new(py);
    a.set_item(intern!(py, "has_search_bar"), s.has_search_bar)?;
    a.set_item(intern!(py, "clickables"), &s.clickables)?;
    d.set_item(intern!(py, "available_actions"), a)?;
    d.set_item(intern!(py, "url"), &s.url)?;
    if let Some(r) = &s.reward_info {
        let ri = PyDict::new(py);
        ri.set_item(intern!(py, "r_type"), r.r_type)?;
        ri.set_item(intern!(py, "r_att"), r.r_att)?;
        ri.set_item(intern!(py, "w_att"), r.w_att)?;
        ri.set_item(intern!(py, "query_match"), r.query_match)?;
        ri.set_item(intern!(py, "category_match"), r.category_match)?;
        ri.set_item(intern!(py, "title_score"), r.title_score)?;
        if let (Some(o), Some(w)) = (r.r_option, r.w_option) {
            ri.set_item(intern!(py, "r_option"), o)?;
            ri.set_item(intern!(py, "w_option"), w)?;
        }
        ri.set_item(intern!(py, "r_price"), r.r_price)?;
        ri.set_item(intern!(py, "w_price"), r.w_price)?;
        d.set_item(intern!(py, "reward_info"), ri)?;
    }
    Ok(d)
}

#[pymethods]
impl PyWebShopEnv {
    /// `reset(goal_index)`: the search page of that goal; None: a weight-sampled goal (the
    /// original's session-less reset). info: available_actions, url, goal, goal_index.
    #[pyo3(signature = (goal_index = None))]
    fn reset<'py>(
        &mut self,
        py: Python<'py>,
        goal_index: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
        let s = match goal_index {
            None => self.env.reset_random(),
            Some(g) => {
                let i = goal_index_arg(g, self.env.shop().num_goals())?;
                // the page of reset(i) is the same for every env: kept with the goal
                let (obs, d) = self.goal_dicts.reset(py, &mut self.env, i)?;
                return Ok((obs.into_any(), d));
            }
        };
        let d = info(py, &s)?;
        let goal = self
            .goal_dicts
            .get(py, self.env.shop(), self.env.goal_index(), Some(self.env.goal()))?;
        d.set_item(intern!(py, "goal"), goal)?;
        d.set_item(intern!(py, "goal_index"), self.env.goal_index())?;
        Ok((PyString::new(py, &s.obs).into_any(), d))
    }

    /// `reset(goal_index)` made the plain way (the env's step result converted, the goal dict
    /// made anew): the reference the kept pages and goal dicts of `reset` are tested against.
    fn reset_reference<'py>(&mut self, py: Python<'py>, goal_index: usize) -> PyResult<(String, Bound<'py, PyDict>)> {
        let s = self.env.reset(goal_index).map_err(webshop_err)?;
        let d = info(py, &s)?;
        d.set_item(
            intern!(py, "goal"),
            goal_to_dict(py, &self.env.shop().goal(goal_index))?,
        )?;
        d.set_item(intern!(py, "goal_index"), self.env.goal_index())?;
        Ok((s.obs, d))
    }

    /// `step(action)` -> (obs, reward, done, info); reward is the int 0 for a no-op, a float
    /// otherwise. Raises WebShopStepError where the original raises.
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        action: &Bound<'py, PyAny>,
    ) -> PyResult<(String, Py<PyAny>, bool, Bound<'py, PyDict>)> {
        let action = action
            .cast::<PyString>()
            .map_err(|_| PyTypeError::new_err(format!("action: expected a str, got {}", type_name(action))))?;
        let text = action.to_string_lossy().into_owned();
        let s = py.detach(|| self.env.step(&text)).map_err(webshop_err)?;
        let reward: Py<PyAny> = if s.noop {
            0i64.into_pyobject(py)?.into_any().unbind()
        } else {
            s.reward.into_pyobject(py)?.into_any().unbind()
        };
        let d = info(py, &s)?;
        Ok((s.obs, reward, s.done, d))
    }

    /// The current page: (obs, info) without acting.
    fn observe<'py>(&self, py: Python<'py>) -> PyResult<(String, Bound<'py, PyDict>)> {
        let s = self.env.current();
        let d = info(py, &s)?;
        Ok((s.obs, d))
    }

    /// The scripted expert's next action (search with the instruction, open the goal's product,
    /// choose its options, buy); None once the episode is over.
    fn expert_action(&self) -> Option<String> {
        self.env.expert_action()
    }

    #[getter]
    fn goal_index(&self) -> usize {
        self.env.goal_index()
    }

    #[getter]
    fn goal<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.goal_dicts
            .get(py, self.env.shop(), self.env.goal_index(), Some(self.env.goal()))
    }

    #[getter]
    fn instruction_text(&self) -> String {
        self.env.goal().instruction_text.clone()
    }

    #[getter]
    fn steps(&self) -> usize {
        self.env.steps()
    }

    #[getter]
    fn url(&self) -> String {
        self.env.url().to_string()
    }
}

/// `(entries, distinct names)` of a product file, streamed (GIL released).
#[pyfunction]
fn webshop_scan_products(py: Python<'_>, path: PathBuf) -> PyResult<(usize, Vec<String>)> {
    py.detach(|| crate::envs::webshop::catalog::scan_products(&path))
        .map_err(webshop_err)
}

/// The number of entries of the JSON array or object in a file, streamed (GIL released).
#[pyfunction]
fn webshop_json_length(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    py.detach(|| crate::envs::webshop::catalog::json_len(&path))
        .map_err(webshop_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(webshop_scan_products, m)?)?;
    m.add_function(wrap_pyfunction!(webshop_json_length, m)?)?;
    m.add_class::<PyWebShop>()?;
    m.add_class::<PyWebShopEnv>()?;
    m.add("WebShopStepError", m.py().get_type::<WebShopStepError>())?;
    Ok(())
}
