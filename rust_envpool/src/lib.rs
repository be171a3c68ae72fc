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

/// mimalloc for all of the crate's allocations: env steps, prompts and the pool allocate many
/// small strings on worker threads that the calling thread frees, and glibc's malloc spent ~40 %
/// of a worker's time in allocation at 4,096 envs (heap consolidation, cross-thread frees).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
