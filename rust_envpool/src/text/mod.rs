//! The text side of a rollout, independent of any environment and of the pool: chat templates
//! rendered with minijinja ([`chat`]), the tokenizer with its cache of encoded pieces
//! ([`tokenize`], [`piece_cache`]), the paper's prompt templates ([`prompt`]) and any text
//! environment's template ([`template`]), the skill
//! repository ([`skills`]) and action parsing ([`parse`]). Every module returns the one error type
//! of [`error`], which sits below all of them.
//!
//! Import order (arrows point down, no cycles): `prompt` -> `skills`, `template`, `tokenize`; `tokenize` ->
//! `chat`, `piece_cache`; all of them -> `error`. Nothing here imports `envs`, `pool` or `python`.

pub mod chat;
pub mod error;
pub mod parse;
pub mod piece_cache;
pub mod prompt;
pub mod skills;
pub mod template;
pub mod tokenize;
