//! The serial part of `PromptBuilder.build_batch` / `encode_batch`: reading the Python requests
//! and handing back token ids. Both run with the GIL held while the prompt threads wait, so they
//! are kept small:
//!
//! * Requests are read in place: every `str` of a request is kept alive by a strong reference
//!   and lent to the prompt threads as `&str` (no copy, no allocation per string). Only the last
//!   `history_length` history entries are read: the template shows no more.
//! * Token ids go out as lists of shared `int` objects ([`IntCache`]): the ids of a prompt repeat
//!   across prompts (template text, admissible commands), so each id's `int` is built once per
//!   builder and then only referenced; freeing a list then frees no `int`.
//!
//! `tests/test_prompts.py` compares the batch with one `build`/`build_teacher` + `encode_chat`
//! call per request (owned strings, PyO3's own conversions) and with Hugging Face's ids.

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyMapping, PySequence, PyString};

use crate::text::prompt::{check_history_len, PromptRequest};

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The name of the value being read (`requests[3]['admissible'][7]`), built only for an error.
trait Name: Fn() -> String {}
impl<F: Fn() -> String> Name for F {}

fn bad(what: impl Name, expected: &str, got: &Bound<'_, PyAny>) -> PyErr {
    PyValueError::new_err(format!("{}: expected {expected}, got {}", what(), type_name(got)))
}

/// `value` as a `str` (validated to have a UTF-8 form, so the later `to_str` cannot fail).
fn str_of<'py>(what: impl Name, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    match value.cast_into::<PyString>() {
        Ok(s) => {
            s.to_str()
                .map_err(|e| PyValueError::new_err(format!("{}: not encodable as UTF-8: {e}", what())))?;
            Ok(s)
        }
        Err(e) => Err(bad(what, "str", &e.into_inner())),
    }
}

/// A sequence that is not a `str` (lists and tuples; other `collections.abc.Sequence`s too).
fn seq_of<'py>(what: impl Name, value: &Bound<'py, PyAny>, expected: &str) -> PyResult<Bound<'py, PySequence>> {
    if value.is_instance_of::<PyString>() {
        return Err(bad(what, expected, value));
    }
    value
        .cast::<PySequence>()
        .cloned()
        .map_err(|_| bad(what, expected, value))
}

/// A dict, or another `collections.abc.Mapping`.
fn is_mapping(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyDict>() || v.cast::<PyMapping>().is_ok()
}

/// Value of `key` (an interned `str`, so a dict finds it by identity) in a request mapping;
/// `None` when absent.
fn item<'py>(req: &Bound<'py, PyAny>, key: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Ok(d) = req.cast::<PyDict>() {
        return d.get_item(key);
    }
    match req.get_item(key) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyError>(req.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where one request's strings lie in [`Requests::strs`].
struct Spans {
    task: usize,
    observation: usize,
    admissible: std::ops::Range<usize>,
    /// observation, action, observation, action, ... of the history tail
    history: std::ops::Range<usize>,
    step: usize,
}

/// The requests of one call, read and validated; their strings kept alive.
pub struct Requests<'py> {
    strs: Vec<Bound<'py, PyString>>,
    spans: Vec<Spans>,
}

impl<'py> Requests<'py> {
    /// Read `requests` (a sequence of mappings with `task`, `observation`, `admissible` and
    /// optionally `history` and `step`), keeping the last `history_length` history entries.
    /// Errors name the request and the key.
    pub fn read(requests: &Bound<'py, PyAny>, history_length: usize) -> PyResult<Self> {
        let py = requests.py();
        let [k_task, k_obs, k_adm, k_hist, k_step, k_act] = [
            intern!(py, "task"),
            intern!(py, "observation"),
            intern!(py, "admissible"),
            intern!(py, "history"),
            intern!(py, "step"),
            intern!(py, "action"),
        ];
        let seq = seq_of(|| "requests".into(), requests, "a list of request mappings")?;
        let n = seq.len()?;
        let mut strs = Vec::with_capacity(n * (8 + 2 * history_length));
        let mut spans = Vec::with_capacity(n);
        for (i, req) in seq.try_iter()?.enumerate() {
            let req = req?;
            if !is_mapping(&req) {
                return Err(bad(|| format!("requests[{i}]"), "a mapping", &req));
            }
            let need = |key: &Bound<'py, PyString>| -> PyResult<Bound<'py, PyAny>> {
                item(&req, key)?.ok_or_else(|| PyValueError::new_err(format!("requests[{i}]: missing key '{key}'")))
            };
            strs.push(str_of(|| format!("requests[{i}]['task']"), need(k_task)?)?);
            strs.push(str_of(|| format!("requests[{i}]['observation']"), need(k_obs)?)?);
            let adm = need(k_adm)?;
            let adm = seq_of(|| format!("requests[{i}]['admissible']"), &adm, "a list of strings")?;
            let a0 = strs.len();
            for (k, a) in adm.try_iter()?.enumerate() {
                strs.push(str_of(|| format!("requests[{i}]['admissible'][{k}]"), a?)?);
            }
            let admissible = a0..strs.len();
            let step = match item(&req, k_step)? {
                None => 0,
                Some(v) if v.is_instance_of::<PyBool>() => {
                    return Err(bad(|| format!("requests[{i}]['step']"), "a non-negative int", &v))
                }
                Some(v) => v.extract::<usize>().map_err(|_| {
                    PyValueError::new_err(format!(
                        "requests[{i}]['step']: expected a non-negative int (steps already taken), got {}",
                        v.repr().map(|r| r.to_string()).unwrap_or_default()
                    ))
                })?,
            };
            let h0 = strs.len();
            if let Some(hist) = item(&req, k_hist)? {
                let hist = seq_of(
                    || format!("requests[{i}]['history']"),
                    &hist,
                    "a list of (observation, action) pairs",
                )?;
                let len = hist.len()?;
                check_history_len(len, step).map_err(|e| PyValueError::new_err(format!("requests[{i}]: {e}")))?;
                for k in len.saturating_sub(history_length)..len {
                    let what = || format!("requests[{i}]['history'][{k}]");
                    let (o, a) = pair(&what, &hist.get_item(k)?, [k_obs, k_act])?;
                    strs.push(o);
                    strs.push(a);
                }
            }
            spans.push(Spans {
                task: a0 - 2,
                observation: a0 - 1,
                admissible,
                history: h0..strs.len(),
                step,
            });
        }
        Ok(Requests { strs, spans })
    }

    /// Lend the requests' text as [`PromptRequest`]s: `f` gets them (and may release the GIL,
    /// the strings stay alive until `self` is dropped).
    pub fn with_requests<R>(&self, f: impl FnOnce(&[PromptRequest<'_>]) -> R) -> PyResult<R> {
        let views: Vec<&str> = self.strs.iter().map(|s| s.to_str()).collect::<PyResult<_>>()?;
        let pairs: Vec<(&str, &str)> = self
            .spans
            .iter()
            .flat_map(|s| views[s.history.clone()].chunks_exact(2).map(|p| (p[0], p[1])))
            .collect();
        let mut reqs = Vec::with_capacity(self.spans.len());
        let mut p0 = 0;
        for s in &self.spans {
            let np = s.history.len() / 2;
            reqs.push(PromptRequest {
                task: views[s.task],
                observation: views[s.observation],
                admissible: &views[s.admissible.clone()],
                history: &pairs[p0..p0 + np],
                step: s.step,
            });
            p0 += np;
        }
        Ok(f(&reqs))
    }
}

/// One history entry: an `(observation, action)` pair or a mapping with those keys.
fn pair<'py>(
    what: &impl Name,
    h: &Bound<'py, PyAny>,
    keys: [&Bound<'py, PyString>; 2],
) -> PyResult<(Bound<'py, PyString>, Bound<'py, PyString>)> {
    if is_mapping(h) {
        let get = |key: &Bound<'py, PyString>| {
            item(h, key)?.ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{}: expected keys 'observation' and 'action', missing '{key}'",
                    what()
                ))
            })
        };
        let o = str_of(|| format!("{}['observation']", what()), get(keys[0])?)?;
        return Ok((o, str_of(|| format!("{}['action']", what()), get(keys[1])?)?));
    }
    let seq = seq_of(what, h, "an (observation, action) pair")?;
    let n = seq.len()?;
    if n != 2 {
        return Err(PyValueError::new_err(format!(
            "{}: expected an (observation, action) pair, got {n} items",
            what()
        )));
    }
    Ok((
        str_of(|| format!("{}[0]", what()), seq.get_item(0)?)?,
        str_of(|| format!("{}[1]", what()), seq.get_item(1)?)?,
    ))
}

/// Ids at or above this get a fresh `int` each time instead of a cache slot (no tokenizer has a
/// vocabulary near it; it bounds the cache at 8 MiB of pointers).
const MAX_CACHED_ID: u32 = 1 << 20;

/// The `int` object of each token id, built on first sight and then shared.
#[derive(Default)]
pub struct IntCache {
    by_id: Mutex<Vec<Option<Py<PyAny>>>>,
}

impl IntCache {
    /// Many id lists under one lock. Building a list can run a garbage collection, and with it
    /// finalizers that might call back into the same builder: the lock is only tried, and a
    /// call that finds it held builds its ints afresh (same values).
    pub fn lists<'py, 'a>(
        &self,
        py: Python<'py>,
        all: impl Iterator<Item = &'a [u32]>,
    ) -> PyResult<Vec<Bound<'py, PyList>>> {
        let mut own = Vec::new();
        let mut guard = match self.by_id.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        let cache = guard.as_deref_mut().unwrap_or(&mut own);
        all.map(|ids| Self::list_with(py, cache, ids)).collect()
    }

    fn list_with<'py>(
        py: Python<'py>,
        cache: &mut Vec<Option<Py<PyAny>>>,
        ids: &[u32],
    ) -> PyResult<Bound<'py, PyList>> {
        let n = ffi::Py_ssize_t::try_from(ids.len())
            .map_err(|_| PyValueError::new_err("token ids: too many for a Python list"))?;
        // SAFETY: PyList_New returns a new reference (or NULL with an exception set); each slot
        // is filled exactly once below with a new (owned) reference, which PyList_SetItem steals.
        // On an early return the partly filled list is dropped: CPython allows NULL slots there.
        unsafe {
            let list = Bound::from_owned_ptr_or_err(py, ffi::PyList_New(n))?;
            for (k, &id) in ids.iter().enumerate() {
                let obj = if id < MAX_CACHED_ID {
                    let i = id as usize;
                    if i >= cache.len() {
                        cache.resize_with(i + 1, || None);
                    }
                    match &cache[i] {
                        Some(o) => o.clone_ref(py),
                        None => {
                            let o = id.into_pyobject(py)?.into_any().unbind();
                            cache[i] = Some(o.clone_ref(py));
                            o
                        }
                    }
                } else {
                    id.into_pyobject(py)?.into_any().unbind()
                };
                if ffi::PyList_SetItem(list.as_ptr(), k as ffi::Py_ssize_t, obj.into_ptr()) != 0 {
                    return Err(PyErr::fetch(py));
                }
            }
            Ok(list.cast_into_unchecked())
        }
    }
}
