"""Rollouts: generation backends (:mod:`pcsd.rollout.backends`: vLLM and Hugging Face) and the
batched multi-turn loop over the env pool (:mod:`pcsd.rollout.loop`).

Imports envs, text and models; never eval or train.
"""
