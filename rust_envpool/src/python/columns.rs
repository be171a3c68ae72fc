//! A batch of pool results as Python objects. This runs with the GIL held on the calling thread
//! while the workers wait, so it is the serial part of every `reset`/`step`/`recv` and is kept
//! small:
//!
//! * Admissible commands and task types repeat from step to step and across the envs of a group;
//!   their `str` objects are built once and then shared from a per-pool [`StrCache`] (keyed by
//!   content, so the lists hold exactly the same text as building every string anew, which is the
//!   plain path [`StrCache::disabled`] takes).
//! * Numeric and boolean columns go out as one `bytearray` each (native byte order), which
//!   `pcsd.envs.pool` views with `np.frombuffer` instead of building a Python number per env.
//! * Observations and errors are new every step: built as usual.
//!
//! Order of the tuple (`pcsd.envs.pool.StepBatch._from_columns` reads it): env_id (i64), obs,
//! admissible, reward (f64), score (f64), done (u8), won (u8), truncated (u8), task_type,
//! step_count (u32), error ("" when none).

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyList, PyString, PyTuple};

use crate::pool::StepResult;

/// `str` objects of strings that repeat, keyed by content. Bounded: when full it starts over.
pub struct StrCache {
    map: HashMap<String, Py<PyString>, ahash::RandomState>,
    limit: usize,
}

impl StrCache {
    /// Distinct strings kept before the cache starts over: far more than the commands of the
    /// games a pool plays, small enough (tens of MB at most) to never matter.
    pub const LIMIT: usize = 1 << 18;

    pub fn new(limit: usize) -> Self {
        Self {
            map: HashMap::default(),
            limit,
        }
    }

    /// The plain path: every string is built anew (the reference the cache is tested against).
    pub fn disabled() -> Self {
        Self::new(0)
    }

    /// The `str` object for `s`, from the cache when it holds it.
    pub fn get<'py>(&mut self, py: Python<'py>, s: &str) -> Bound<'py, PyString> {
        if let Some(p) = self.map.get(s) {
            return p.bind(py).clone();
        }
        let p = PyString::new(py, s);
        if self.limit > 0 {
            if self.map.len() >= self.limit {
                self.map.clear();
            }
            self.map.insert(s.to_owned(), p.clone().unbind());
        }
        p
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
pub fn to_python<'py>(
    py: Python<'py>,
    results: &[StepResult],
    cache: &mut StrCache,
) -> PyResult<Bound<'py, PyTuple>> {
    let n = results.len();
    let mut obs = Vec::with_capacity(n);
    let mut admissible = Vec::with_capacity(n);
    let mut task_type = Vec::with_capacity(n);
    let mut error = Vec::with_capacity(n);
    for r in results {
        obs.push(PyString::new(py, &r.obs));
        let adm: Vec<Bound<'py, PyString>> =
            r.admissible.iter().map(|a| cache.get(py, a)).collect();
        admissible.push(PyList::new(py, adm)?);
        task_type.push(cache.get(py, &r.task_type));
        error.push(PyString::new(py, r.error.as_deref().unwrap_or("")));
    }
    let col = |b: Vec<u8>| PyByteArray::new(py, &b);
    let it = || results.iter();
    let items: [Bound<'py, PyAny>; 11] = [
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
    ];
    PyTuple::new(py, items)
}
