//! PyO3 wrapper of the native ALFWorld engine (`pcsd._envpool.AlfworldGame`); the typed Python
//! class is `pcsd.envs.alfworld.AlfworldGame`.

use std::sync::Arc;

use pyo3::exceptions::{PyFileNotFoundError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

fn type_name(x: &Bound<'_, PyAny>) -> String {
    x.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

use crate::envs::alfworld::{AlfworldEnv, GameSpec, LoadError};
use crate::envs::{EnvStep, TextEnv};

fn load_err(e: LoadError) -> PyErr {
    if e.is_not_found() {
        PyFileNotFoundError::new_err(e.to_string())
    } else {
        PyValueError::new_err(e.to_string())
    }
}

#[pyclass(name = "AlfworldGame", module = "pcsd._envpool")]
pub struct PyAlfworldGame {
    env: AlfworldEnv,
}

impl PyAlfworldGame {
    fn info<'py>(&self, py: Python<'py>, s: &EnvStep) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("admissible_commands", s.admissible.clone())?;
        d.set_item("won", s.won)?;
        d.set_item("task_type", self.env.task_type())?;
        Ok(d)
    }
}

fn check_steps(max_steps: i64) -> PyResult<usize> {
    if max_steps < 1 {
        return Err(PyValueError::new_err(format!(
            "max_steps must be a positive integer, got {max_steps}"
        )));
    }
    Ok(max_steps as usize)
}

#[pymethods]
impl PyAlfworldGame {
    #[staticmethod]
    #[pyo3(signature = (path, max_steps = 50))]
    fn from_file(py: Python<'_>, path: std::path::PathBuf, max_steps: i64) -> PyResult<Self> {
        let n = check_steps(max_steps)?;
        let spec = py.detach(|| GameSpec::from_path(&path)).map_err(load_err)?;
        Ok(Self {
            env: AlfworldEnv::new(Arc::new(spec), n),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (text, max_steps = 50, source = "<json>"))]
    fn from_json(py: Python<'_>, text: &str, max_steps: i64, source: &str) -> PyResult<Self> {
        let n = check_steps(max_steps)?;
        let spec = py.detach(|| GameSpec::from_json_str(text, source)).map_err(load_err)?;
        Ok(Self {
            env: AlfworldEnv::new(Arc::new(spec), n),
        })
    }

    fn reset<'py>(&mut self, py: Python<'py>) -> PyResult<(String, Bound<'py, PyDict>)> {
        let s = py.detach(|| self.env.reset());
        let info = self.info(py, &s)?;
        Ok((s.obs, info))
    }

    fn step<'py>(
        &mut self,
        py: Python<'py>,
        command: &Bound<'py, PyAny>,
    ) -> PyResult<(String, f64, bool, Bound<'py, PyDict>)> {
        let command = command
            .cast::<PyString>()
            .map_err(|_| PyTypeError::new_err(format!("command must be a str, got {}", type_name(command))))?;
        // Lone surrogates cannot match a command: they become U+FFFD ("Nothing happens.").
        let text = command.to_string_lossy().into_owned();
        let s = py.detach(|| self.env.step(&text));
        let info = self.info(py, &s)?;
        Ok((s.obs, s.score, s.done, info))
    }

    fn admissible_commands(&self) -> Vec<String> {
        self.env.admissible_commands().to_vec()
    }

    fn expert_plan(&self, py: Python<'_>) -> Option<Vec<String>> {
        py.detach(|| self.env.expert_plan())
    }

    #[getter]
    fn task(&self) -> String {
        self.env.task().to_string()
    }

    #[getter]
    fn task_type(&self) -> String {
        self.env.task_type().to_string()
    }

    #[getter]
    fn max_steps(&self) -> usize {
        self.env.max_steps()
    }

    #[getter]
    fn steps(&self) -> usize {
        self.env.steps()
    }

    #[getter]
    fn walkthrough(&self) -> Vec<String> {
        self.env.spec().walkthrough().to_vec()
    }

    #[getter]
    fn source(&self) -> String {
        self.env.spec().source().to_string()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAlfworldGame>()?;
    Ok(())
}
