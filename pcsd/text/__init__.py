"""The text side of a rollout: the Rust-backed prompt builder (the paper's templates, chat
template, tokenizer), the skill repository and action parsing (:mod:`pcsd.text.prompts`).

Imports only the native module: nothing of ops, envs, rollout, eval or train.
"""
