"""Training configuration: typed schema (OmegaConf structured configs), presets, dotted overrides.

    python -m pcsd.train preset=alfworld-qwen2.5-3b model.path=/models/Qwen2.5-3B-Instruct rule=sdar

A wrong key or a value of the wrong type or outside its choices is a :class:`ConfigError` that
lists the valid keys or values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

PRESET_DIR = Path(__file__).parent / "configs"


class ConfigError(ValueError):
    """A configuration key or value is not valid; the message lists what is."""


@dataclass
class ModelConfig:
    path: Optional[str] = None  # local HF checkpoint; None = make the tiny generated model
    tiny_hidden_size: int = 64
    tiny_layers: int = 2
    dtype: str = "auto"  # auto | float32 | bfloat16


@dataclass
class EnvConfig:
    name: str = "alfworld"
    source: str = "procedural"  # procedural | files
    split: str = "train"  # train | valid_seen | valid_unseen (source=files)
    max_steps: int = 50
    history_length: int = 2
    num_threads: int = 0  # env pool threads; 0 = all cores
    # difficulty of procedural games (source=procedural); None = drawn as typical of the room
    receptacles: Optional[int] = None  # total receptacles, at least the room's minimum
    distractors: Optional[int] = None  # objects besides the task's own


@dataclass
class RolloutConfig:
    backend: str = "vllm"  # vllm | hf (vllm falls back to hf when vLLM is absent)
    tasks_per_step: int = 16
    group_size: int = 8
    max_prompt_tokens: int = 2048
    max_response_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    invalid_action_penalty: float = 0.0


@dataclass
class PcsdParams:
    n_min: int = 1
    n_max: int = 8
    alpha: float = 0.8
    tau_low: float = 0.05
    tau_high: float = 0.5
    gamma: float = 0.3
    beta_gate: float = 5.0


@dataclass
class AlgoConfig:
    grpo: bool = True  # False: distillation only (OPSD)
    distill: bool = True  # False: plain GRPO (no teacher scoring)
    lambda_distill: float = 0.01
    kl_beta: float = 0.01
    clip_eps: float = 0.2
    adv_eps: float = 1e-6
    loss_agg: str = "seq-mean-token-mean"
    teacher: str = "frozen"  # frozen | current
    student_skills: bool = False  # Skill-GRPO
    success_reward: float = 10.0
    pcsd: PcsdParams = field(default_factory=PcsdParams)


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    steps: int = 150
    ppo_epochs: int = 1
    tokens_per_microbatch: int = 8192
    sft_steps: int = 0  # supervised warm-up on expert trajectories of procedural games
    sft_lr: float = 3e-3


@dataclass
class EvalConfig:
    split: str = "valid_seen"
    episodes: int = 0  # 0 = every game of the split once
    temperature: float = 0.4
    greedy: bool = False
    skills: bool = False  # the starred variants: skills at evaluation


@dataclass
class RunConfig:
    dir: Optional[str] = None  # default runs/<preset>-<rule>-<time>
    seed: int = 0
    device: str = "auto"
    save_every: int = 50
    log_every: int = 1


@dataclass
class TrainConfig:
    preset: str = "tiny-cpu"
    rule: str = "pcsd"
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)


CHOICES: dict[str, tuple[str, ...]] = {
    "env.name": ("alfworld",),
    "env.source": ("procedural", "files"),
    "env.split": ("train", "valid_seen", "valid_unseen"),
    "rollout.backend": ("vllm", "hf"),
    "algo.loss_agg": ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum"),
    "algo.teacher": ("frozen", "current"),
    "eval.split": ("valid_seen", "valid_unseen", "train"),
    "model.dtype": ("auto", "float32", "bfloat16"),
    "run.device": ("auto", "cpu", "cuda"),
}


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _keys(node: Any, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        name = f"{prefix}{f.name}"
        out += _keys(v, name + ".") if dataclasses.is_dataclass(v) else [name]
    return out


def valid_keys() -> list[str]:
    return _keys(TrainConfig())


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """Schema defaults <- preset file <- dotted ``key=value`` overrides, validated."""
    overrides = list(overrides or [])
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"override {o!r} is not key=value; valid keys: {', '.join(valid_keys())}")
    preset = "tiny-cpu"
    for o in overrides:
        k, v = o.split("=", 1)
        if k.strip() == "preset":
            preset = v.strip()
    if preset not in available_presets():
        raise ConfigError(f"unknown preset {preset!r}; valid presets: {', '.join(available_presets())}")
    cfg = OmegaConf.structured(TrainConfig)
    OmegaConf.set_struct(cfg, True)
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.load(PRESET_DIR / f"{preset}.yaml"))
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    except (ConfigAttributeError, ConfigKeyError) as exc:
        key = getattr(exc, "full_key", None) or str(exc).split("\n")[0]
        raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(valid_keys())}") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"bad config value: {str(exc).splitlines()[0]} "
                          f"(key {getattr(exc, 'full_key', '?')!r})") from None
    _validate(cfg)
    return cfg


def _validate(cfg: DictConfig) -> None:
    from pcsd.weighting import available_rules

    for key, choices in CHOICES.items():
        val = OmegaConf.select(cfg, key)
        if val not in choices:
            raise ConfigError(f"{key}={val!r} is not valid; choose one of {', '.join(choices)}")
    if cfg.rule not in available_rules():
        raise ConfigError(f"rule={cfg.rule!r} is not valid; choose one of {', '.join(available_rules())}")
    positive = ["rollout.tasks_per_step", "rollout.group_size", "rollout.max_prompt_tokens",
                "rollout.max_response_tokens", "env.max_steps", "optim.tokens_per_microbatch",
                "optim.ppo_epochs"]
    for key in positive:
        if OmegaConf.select(cfg, key) <= 0:
            raise ConfigError(f"{key} must be > 0, got {OmegaConf.select(cfg, key)}")
    for key in ["optim.steps", "env.history_length", "algo.lambda_distill", "algo.kl_beta",
                "optim.lr", "optim.grad_clip", "rollout.temperature", "eval.episodes"]:
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {OmegaConf.select(cfg, key)}")
    if not 0 < cfg.algo.clip_eps < 1:
        raise ConfigError(f"algo.clip_eps must be in (0, 1), got {cfg.algo.clip_eps}")
    if not (cfg.algo.grpo or cfg.algo.distill or cfg.optim.steps == 0):
        raise ConfigError("algo.grpo and algo.distill are both false: nothing to train "
                          "(use optim.steps=0 for the Vanilla baseline)")
