//! pcsd-envpool: the native side of pcsd's rollouts.
//!
//! The crate is plain Rust; `cargo test` exercises it without Python. Its layers, each importing
//! only the ones below it:
//!
//! - [`envs`]: the environment trait and one module per environment (ALFWorld, the procedural
//!   ALFWorld generator, the dummy env);
//! - [`pool`]: the batched env pool (sync and async), which steps any [`envs::TextEnv`];
//! - [`text`]: chat templates, tokenizer, prompts, skills and action parsing (no environment);
//! - [`python`]: the PyO3 binding layer behind the `python` feature, exposed to Python as the
//!   private module `pcsd._envpool` (typed wrappers live in the `pcsd` package).
//!
//! `tests/layers.rs` checks that no module imports upwards.

pub mod envs;
pub mod pool;
pub mod text;
pub mod version;

#[cfg(feature = "python")]
pub mod python;

/// mimalloc for all of the crate's allocations: env steps, prompts and the pool allocate many
/// small strings on worker threads that the calling thread frees, and glibc's malloc spent ~40 %
/// of a worker's time in allocation at 4,096 envs (heap consolidation, cross-thread frees).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
