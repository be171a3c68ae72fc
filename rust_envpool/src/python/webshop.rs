//! PyO3 wrapper of the native WebShop (`pcsd._envpool.WebShop`, `WebShopEnv`); the typed Python
//! API is `pcsd.envs.webshop`.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::create_exception;
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::envs::webshop::{
    CachePolicy, Goal, GoalOptions, GoalSet, Shop, ShopConfig, ShopFiles, Variant, WebShopEnv, WebShopError,
    WebShopStep,
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

/// Goal dicts made recently, per goal index, shared by a shop's envs (a group of envs resets
/// to the same goal): each caller gets a copy whose containers are its own.
#[derive(Default)]
struct GoalDicts(std::sync::Mutex<std::collections::HashMap<usize, Py<PyDict>>>);

/// Goal dicts kept; cleared when it holds this many.
const GOAL_DICTS: usize = 4096;

impl GoalDicts {
    /// The goal dict of goal `i` of `shop` (`goal`: that goal, when at hand).
    fn get<'py>(&self, py: Python<'py>, shop: &Shop, i: usize, goal: Option<&Goal>) -> PyResult<Bound<'py, PyDict>> {
        let kept = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&i)
            .map(|d| d.clone_ref(py));
        let kept = match kept {
            Some(d) => d.into_bound(py),
            None => {
                let d = match goal {
                    Some(g) => goal_to_dict(py, g)?,
                    None => goal_to_dict(py, &shop.goal(i))?,
                };
                let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
                if map.len() >= GOAL_DICTS {
                    map.clear();
                }
                map.insert(i, d.clone().unbind());
                d
            }
        };
        // a copy: the dict, its attribute list and its options its own; the strings shared
        let d = kept.copy()?;
        for key in [intern!(py, "attributes"), intern!(py, "goal_options")] {
            if let Some(v) = d.get_item(key)? {
                if let Ok(l) = v.cast::<PyList>() {
                    d.set_item(key, l.get_slice(0, l.len()))?;
                } else if let Ok(o) = v.cast::<PyDict>() {
                    d.set_item(key, o.copy()?)?;
                }
            }
        }
        Ok(d)
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
    ) -> PyResult<(String, Bound<'py, PyDict>)> {
        let s = match goal_index {
            None => self.env.reset_random(),
            Some(g) => {
                if g.is_instance_of::<pyo3::types::PyBool>() {
                    return Err(PyTypeError::new_err("goal_index: expected an int, got bool"));
                }
                let n = self.env.shop().num_goals();
                if !g.is_instance_of::<pyo3::types::PyInt>() {
                    return Err(PyTypeError::new_err(format!(
                        "goal_index: expected an int, got {}",
                        type_name(g)
                    )));
                }
                let i: i64 = g
                    .extract()
                    .map_err(|_| PyValueError::new_err(format!("goal_index: expected an int in [0, {n}), got {g}")))?;
                let i = usize::try_from(i).ok().filter(|&i| i < n).ok_or_else(|| {
                    PyValueError::new_err(format!("goal_index: expected an int in [0, {n}), got {i}"))
                })?;
                self.env.reset(i).map_err(webshop_err)?
            }
        };
        let d = info(py, &s)?;
        let goal = self
            .goal_dicts
            .get(py, self.env.shop(), self.env.goal_index(), Some(self.env.goal()))?;
        d.set_item(intern!(py, "goal"), goal)?;
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
