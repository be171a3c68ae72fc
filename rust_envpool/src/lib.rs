//! pcsd-envpool: the native side of pcsd's rollouts.
//!
//! The crate is plain Rust; `cargo test` exercises it without Python. The PyO3 layer lives in
//! [`python`] behind the `python` feature and is exposed to Python as the private module
//! `pcsd._envpool` (typed wrappers live in the `pcsd` package).

pub mod alfworld_gen;
pub mod chat;
pub mod alfworld;
pub mod env;
pub mod parse;
pub mod piece_cache;
pub mod prompt;
pub mod skills;
pub mod tokenize;
pub mod dummy;
pub mod pool;
pub mod version;

#[cfg(feature = "python")]
pub mod python;
