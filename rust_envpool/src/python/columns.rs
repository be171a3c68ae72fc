//! A batch of pool results as Python objects. This runs with the GIL held on the calling thread
//! while the workers wait, so it is the serial part of every `reset`/`step`/`recv` and is kept
//! small:
//!
//! * Admissible commands and task types repeat from step to step and across the envs of a group;
//!   the workers give them ids in the pool's string table (`crate::pool::strings`) and their `str`
//!   objects are built once per id and then shared ([`SharedStrs`]). A pool built without ids
//!   (the plain path) builds every string anew; the texts are the same either way.
//! * Numeric and boolean columns go out as one `bytearray` each (native byte order), which
//!   `pcsd.envs.pool` views with `np.frombuffer` instead of building a Python number per env.
//! * Observations and errors are new every step: built as usual.
//!
//! Order of the tuple (`pcsd.envs.pool.StepBatch._from_columns` reads it): env_id (i64), obs,
//! admissible, reward (f64), score (f64), done (u8), won (u8), truncated (u8), task_type,
//! step_count (u32), error ("" when none), has_search_bar (u8; WebShop, false for the others).

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyList, PyString, PyTuple};

use crate::pool::{StepResult, NO_ID};

/// The `str` object of each string id of a pool's results, built on first sight.
#[derive(Default)]
pub struct SharedStrs {
    by_id: Vec<Option<Py<PyString>>>,
}

impl SharedStrs {
    /// The `str` of `text`, whose id is `id` ([`NO_ID`]: none, built anew).
    pub fn get<'py>(&mut self, py: Python<'py>, id: u32, text: &str) -> Bound<'py, PyString> {
        if id == NO_ID {
            return PyString::new(py, text);
        }
        let i = id as usize;
        if i >= self.by_id.len() {
            self.by_id.resize_with(i + 1, || None);
        }
        let slot = &mut self.by_id[i];
        match slot {
            Some(p) => p.bind(py).clone(),
            None => {
                let p = PyString::new(py, text);
                *slot = Some(p.clone().unbind());
                p
            }
        }
    }
}

fn bytes_of<T, const N: usize>(items: impl Iterator<Item = T>, to: fn(T) -> [u8; N]) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.size_hint().0 * N);
    for x in items {
        out.extend_from_slice(&to(x));
    }
    out
}

/// The columns of `results` (see the module docs). `results` is only read: the caller decides
/// where the Rust strings are freed.
pub fn to_python<'py>(py: Python<'py>, results: &[StepResult], strs: &mut SharedStrs) -> PyResult<Bound<'py, PyTuple>> {
    let n = results.len();
    let mut obs = Vec::with_capacity(n);
    let mut admissible = Vec::with_capacity(n);
    let mut task_type = Vec::with_capacity(n);
    let mut error = Vec::with_capacity(n);
    for r in results {
        obs.push(PyString::new(py, &r.obs));
        let n_adm = r.admissible.len();
        let id = |k: usize| r.string_ids.as_ref().map_or(NO_ID, |ids| ids[k]);
        let adm: Vec<Bound<'py, PyString>> = r
            .admissible
            .iter()
            .enumerate()
            .map(|(k, a)| strs.get(py, id(k), a))
            .collect();
        admissible.push(PyList::new(py, adm)?);
        task_type.push(strs.get(py, id(n_adm), &r.task_type));
        error.push(PyString::new(py, r.error.as_deref().unwrap_or("")));
    }
    let col = |b: Vec<u8>| PyByteArray::new(py, &b);
    let it = || results.iter();
    let items: [Bound<'py, PyAny>; 12] = [
        col(bytes_of(it().map(|r| r.env_id), i64::to_ne_bytes)).into_any(),
        PyList::new(py, obs)?.into_any(),
        PyList::new(py, admissible)?.into_any(),
        col(bytes_of(it().map(|r| r.reward), f64::to_ne_bytes)).into_any(),
        col(bytes_of(it().map(|r| r.score), f64::to_ne_bytes)).into_any(),
        col(it().map(|r| r.done as u8).collect()).into_any(),
        col(it().map(|r| r.won as u8).collect()).into_any(),
        col(it().map(|r| r.truncated as u8).collect()).into_any(),
        PyList::new(py, task_type)?.into_any(),
        col(bytes_of(it().map(|r| r.step_count), u32::to_ne_bytes)).into_any(),
        PyList::new(py, error)?.into_any(),
        col(it().map(|r| r.has_search_bar as u8).collect()).into_any(),
    ];
    PyTuple::new(py, items)
}
