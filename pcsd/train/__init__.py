"""The training job, ``python -m pcsd.train`` / ``pcsd-train``: the command line
(:mod:`pcsd.train.cli`), the configuration schema and presets (:mod:`pcsd.train.config`,
``configs/``), the methods of the paper's Table 1 (:mod:`pcsd.train.methods`), the job as named
phases (:mod:`pcsd.train.job`), one update (:mod:`pcsd.train.update`), the SFT warm-up
(:mod:`pcsd.train.sft`), checkpoints, FSDP2 helpers and metrics.

The top layer: imports ops, envs, text, models, rollout and eval; nothing imports it.
"""
