//! PyO3 edge: thin wrappers only. Logic stays in the plain Rust modules; each area registers its
//! classes and functions from its own file here.

use pyo3::prelude::*;

mod alfworld;
mod columns;
mod generate;
mod pool;
mod prompts;
mod requests;
mod webshop;

#[pyfunction]
fn version() -> &'static str {
    crate::version::VERSION
}

#[pyfunction]
fn echo(s: &str) -> String {
    crate::version::echo(s)
}

#[pymodule]
fn _envpool(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", crate::version::VERSION)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(echo, m)?)?;
    generate::register(m)?;
    prompts::register(m)?;
    pool::register(m)?;
    alfworld::register(m)?;
    webshop::register(m)?;
    Ok(())
}
