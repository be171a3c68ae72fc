//! The one error type of the text side (chat templates, tokenizer, prompts, skills). It lives
//! below every module that returns it, so they all import downwards.

use std::path::PathBuf;

/// Errors of the prompt, chat-template and tokenizer modules.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("invalid argument `{name}`: expected {expected}")]
    InvalidArgument { name: &'static str, expected: String },
    #[error("{what} not found: {}", path.display())]
    MissingFile { path: PathBuf, what: &'static str },
    #[error("reading {}: {message}", path.display())]
    Io { path: PathBuf, message: String },
    #[error("chat template error: {0}")]
    Template(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error(
        "prompt too long: {tokens} tokens without history exceed max_prompt_tokens={budget} \
         (the prompt is never truncated; raise max_prompt_tokens or shorten the observation)"
    )]
    TooLong { tokens: usize, budget: usize },
}
