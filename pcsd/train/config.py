"""Training configuration: typed schema (OmegaConf structured configs), presets, methods, overrides.

    python -m pcsd.train preset=alfworld-qwen2.5-3b model.path=/models/Qwen2.5-3B-Instruct method=sdar

Resolution order: the schema's defaults <- the preset file (``pcsd/train/configs/<preset>.yaml``) <- the
method's overrides (``method=NAME``, see :mod:`pcsd.train.methods`: vanilla, skill-prompt, grpo,
skill-grpo, opsd, grpo+opsd, rlsd, skill-sd, sdar, sdar-norm, pcsd, pcsd-fixed-n1, pcsd-fixed-n4,
pcsd-no-trend, pcsd-no-decay and the starred ``NAME-star`` variants with skills at evaluation) <- the remaining
dotted ``key=value`` overrides. The resolved config (``method`` included) is saved as
``config.yaml`` in the run directory.

A wrong key, a value of the wrong type or outside its choices, an unknown preset or an unknown
method is a :class:`ConfigError` that lists the valid keys, values, presets or methods.

Resuming (``python -m pcsd.train --resume RUN_DIR`` or ``run.resume=RUN_DIR``) starts from the run's
saved ``config.yaml`` instead of a preset; overrides may only change the keys in
:data:`RESUME_MUTABLE` (where to stop, how often to save, ...). Any other difference changes what
the run means and is an error naming the keys.

Precision (:mod:`pcsd.train.precision`): ``model.param_dtype`` (the trained weights and AdamW state;
float32 = master weights), ``model.compute_dtype`` (forward/backward: autocast on one device, FSDP2's
``MixedPrecisionPolicy`` when sharded), ``model.teacher_dtype`` (the frozen teacher/reference copy),
``model.export_dtype`` (``final-model/``). bf16 parameters with an optimizer are refused (the updates
round away) unless ``optim.allow_low_precision_params=true``. The old ``model.dtype`` is refused with
what replaced it. Every range is checked here, when the config is read (:func:`_validate_ranges`);
``python -m pcsd.train ... --plan`` prints the memory plan (:mod:`pcsd.train.plan`).

Checkpoints (:mod:`pcsd.train.checkpoint`): every ``run.save_every`` steps (0 = only at the end) and at
the end, keeping the newest ``run.keep_last`` (0 = all). ``run.stop_after=K`` stops this invocation
after K steps in total (checkpoint written), for preemptible schedulers and the resume test.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from pcsd.ops.defaults import PCSD_DEFAULTS
from pcsd.text.paths import PRESET_DIR, resolve_config_path
from pcsd.text.prompts import DEFAULT_MAX_PRIVILEGED_TOKENS


class ConfigError(ValueError):
    """A configuration key or value is not valid; the message lists what is."""


class ConfigWarning(UserWarning):
    """A configuration key that has no effect under the chosen method (given once, at config read)."""


@dataclass
class ModelConfig:
    path: Optional[str] = None  # local HF checkpoint; None = make the tiny generated model
    tiny_hidden_size: int = 64
    tiny_layers: int = 2
    # precision (pcsd.train.precision): fp32 master weights + bf16 compute is what trains at lr 1e-6
    param_dtype: str = "float32"  # the trained student's parameters and AdamW state: float32 | bfloat16
    compute_dtype: str = "float32"  # forward/backward (autocast; FSDP2 param_dtype): float32 | bfloat16
    teacher_dtype: str = "float32"  # the frozen teacher/reference copy: float32 | bfloat16
    export_dtype: str = "float32"  # final-model/: float32 | bfloat16
    enable_thinking: Optional[bool] = None  # the chat template's enable_thinking (Qwen3); None = its default
    # how scoring and update passes attend (pcsd.models.attention_choice): auto | flash | flex | sdpa-padded
    attn_impl: str = "auto"
    # LoRA (pcsd.lora, docs/lora.md): rank 0 = off (full fine-tuning). The base weights are frozen in
    # compute_dtype and are the teacher/reference (adapters switched off); adapters and AdamW state: param_dtype
    lora_rank: int = 0
    lora_alpha: Optional[float] = None  # adapters' output scaled by alpha / rank; None = the rank (scale 1)
    lora_targets: Optional[List[str]] = None  # module names; None = every linear layer of attention and MLP
    lora_dropout: float = 0.0  # dropout on the adapters' input, in [0, 1)


def _kind_fields(where: str) -> list[tuple[str, Any, Any]]:
    """The fields of the config group ``where`` that the env kinds own (pcsd.envs.registry)."""
    import copy

    from pcsd.envs import registry

    def default(v: Any) -> Any:
        return field(default_factory=lambda: copy.deepcopy(v)) if isinstance(v, (dict, list)) else field(default=v)

    return [(k.name, k.type, default(k.default)) for k in registry.config_keys(where)]


def _default_env() -> str:
    from pcsd.envs import registry

    return registry.default().name


#: the env section: the keys every kind reads, then each kind's own (pcsd.envs.kind.Key, from the registry)
EnvConfig = dataclasses.make_dataclass(
    "EnvConfig",
    [
        ("name", str, field(default=_default_env())),  # a kind of pcsd.envs.registry
        ("max_steps", int, field(default=50)),
        ("history_length", int, field(default=2)),
        ("num_threads", int, field(default=0)),  # env pool threads / Python env worker processes; 0 = all cores
        # the teacher's skill repository: a folder replacing the built-in skills (pcsd.text.prompts.SkillRepository);
        # a relative path given on the command line is read from the current folder, a preset's first next to it
        ("skills_dir", Optional[str], field(default=None)),
        *_kind_fields("env"),
    ],
)


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
    gpu_memory_utilization: float = 0.4  # vLLM's share of each GPU (its weights + KV cache); see --plan
    sync_bucket_mb: float = 512.0  # the weight sync to the generation engine streams buckets of at most this many MiB
    # DAPO's dynamic sampling: groups whose rewards are all equal are dropped and more groups played until
    # tasks_per_step carry a signal or max_sample_batches batches were played (pcsd.train.sampling)
    dynamic_sampling: bool = False
    max_sample_batches: int = 3
    # the env's privileged text (info["privileged"]) in a teacher prompt: its first this many tokens (null: all)
    max_privileged_tokens: Optional[int] = DEFAULT_MAX_PRIVILEGED_TOKENS


@dataclass
class PcsdParams:  # the weighting rules' parameters; defaults: pcsd.ops.defaults (the one place they are written)
    n_min: int = PCSD_DEFAULTS.n_min
    n_max: int = PCSD_DEFAULTS.n_max
    alpha: float = PCSD_DEFAULTS.alpha
    tau_low: float = PCSD_DEFAULTS.tau_low
    tau_high: float = PCSD_DEFAULTS.tau_high
    gamma: float = PCSD_DEFAULTS.gamma
    beta_gate: float = PCSD_DEFAULTS.beta_gate


@dataclass
class GigpoParams:
    step_weight: float = 1.0  # weight of the step-level advantage (0: the episode advantage alone)
    norm: str = "mean_std"  # mean_std | mean (both levels: divide by the std, or only subtract the mean)
    gamma: float = 0.95  # discount of the step returns


@dataclass
class AlgoConfig:
    grpo: bool = True  # False: distillation only (OPSD)
    distill: bool = True  # False: plain GRPO (no teacher scoring)
    estimator: str = "grpo"  # advantage estimator (pcsd.ops.estimators): grpo | rloo | gigpo
    policy_loss: str = "ppo"  # policy-gradient loss (pcsd.ops.policy_losses): ppo | gspo
    lambda_distill: float = 0.01
    kl_beta: float = 0.01
    clip_eps: float = 0.2  # the ratio's lower clip, 1 - clip_eps (and the upper one unless clip_eps_high is set)
    clip_eps_high: Optional[float] = None  # the upper clip, 1 + clip_eps_high (DAPO: 0.28); None = clip_eps
    adv_eps: float = 1e-6
    # what the estimators' group statistics count: trajectory (the paper) | row (every turn, as the SDAR code)
    group_stats: str = "trajectory"
    loss_agg: str = "seq-mean-token-mean"
    teacher: str = "frozen"  # frozen | current
    # the teacher's privileged context: env (skills + the env's info["privileged"]) | group-success (+ a peer's success)
    teacher_context: str = "env"
    teacher_context_tokens: int = 1024  # group-success: the peer's episode, at most these tokens
    student_skills: bool = False  # Skill-GRPO
    success_reward: float = 10.0
    pcsd: PcsdParams = field(default_factory=PcsdParams)
    gigpo: GigpoParams = field(default_factory=GigpoParams)  # read by estimator=gigpo


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    steps: int = 150
    ppo_epochs: int = 1
    # an update whose loss or gradient norm is not finite is not applied; this many such RL steps in a row stop the run
    max_nonfinite_updates: int = 3
    tokens_per_microbatch: int = 8192
    gradient_checkpointing: bool = False  # recompute each decoder layer in the backward (activations / ~layers)
    allow_low_precision_params: bool = False  # let AdamW update bf16 parameters (most updates round away)
    fused_lm_head: bool = True  # lm-head + per-token loss in one pass (pcsd.ops.fused); False: recomputing chunks
    # reference and teacher log-probs from one frozen forward per micro-batch: auto = where attention is
    # varlen (packed rows, flash-attention); padded batches would pad every student row to its teacher's width
    joint_frozen_pass: str = "auto"  # auto | always | never
    sft_steps: int = 0  # supervised warm-up on expert trajectories of procedural games
    sft_games: int = 96  # procedural games played by the observation-only expert for the warm-up
    sft_prompt_weight: float = 0.0  # weight of the prompt tokens' next-token loss in the warm-up
    sft_lr: float = 3e-3  # peak learning rate of the warm-up
    sft_batch_size: int = 16  # examples per warm-up step
    sft_schedule: str = "cosine"  # cosine (linear warm-up, cosine decay) | constant
    sft_navigation: str = "plan"  # how the SFT expert moves: plan (the planner's go-tos) | sweep (next receptacle)
    sft_teacher_share: float = 0.0  # share of warm-up steps also shown with the teacher's prompt (skills)
    # what the teacher's-prompt examples demonstrate: same (the student's expert steps) | skills (the expert
    # that searches first the receptacle types its task's retrieved skills name)
    sft_teacher_demos: str = "same"


EvalConfig = dataclasses.make_dataclass(
    "EvalConfig",
    [
        *_kind_fields("eval"),
        # full (every game once) | paper (128 episodes drawn as verl-agent does; docs/eval-protocol.md)
        ("protocol", str, field(default="full")),
        ("episodes", int, field(default=0)),  # 0 = the protocol's count; else a stratified subset / that many draws
        ("every", int, field(default=0)),  # validation every N training steps (0 = only before and after RL)
        ("temperature", float, field(default=0.4)),
        ("greedy", bool, field(default=False)),
        ("skills", bool, field(default=False)),  # the starred variants: skills at evaluation
        ("batch_size", int, field(default=0)),  # games played together (0 = all at once; 1 = a seed per game)
        # false: no evaluation before RL (e.g. the starting model was evaluated already)
        ("before", bool, field(default=True)),
    ],
)


@dataclass
class RunConfig:
    dir: Optional[str] = None  # default runs/<preset>-<rule>-<time>
    seed: int = 0
    device: str = "auto"
    save_every: int = 50  # checkpoint every N steps (0 = only at the end)
    keep_last: int = 3  # keep the newest K checkpoints (0 = all)
    stop_after: int = 0  # stop after this many steps in total, with a checkpoint (0 = run to the end)
    resume: Optional[str] = None  # a run directory: continue from its newest complete checkpoint
    # a new run into a non-empty run.dir: move what it holds to <run.dir>.replaced-<time>/ first (else refused)
    overwrite: bool = False
    log_every: int = 1
    progress: Optional[bool] = None  # rich progress bars; None = on an interactive terminal outside CI
    tensorboard: bool = True  # per-step scalars to <run dir>/tensorboard as well as metrics.jsonl
    record_gaps: bool = False  # per-token gaps/weights/masks of each logged step to <run dir>/gaps/ (npz)
    # episode records in <run dir>/episodes/ (pcsd.train.episodes; the page: python -m pcsd.view): training
    # episodes per step with each response token's gap and weight, failed episodes per evaluation, and the
    # folder's cap in MB (over it, the oldest training steps' files go); 0 turns each off
    log_episodes: int = 4
    log_eval_failures: int = 32
    episodes_max_mb: float = 100.0
    wandb: bool = False  # the step scalars and episode tables to Weights & Biases too (the wandb extra)


@dataclass
class DistConfig:
    # the device mesh FSDP2 shards over under torchrun (pcsd.train.distributed.device_mesh): hsdp = shard
    # within a node, replicate across nodes (2-D); flat = shard over every rank (1-D); one node: the same
    mesh: str = "hsdp"


@dataclass
class ExperimentConfig:
    """Settings for experiments on the method itself (docs/evidence.md), never a preset's (refused
    there): they change what every rule reads, in one place (pcsd.train.update.Terms)."""

    gap_noise: float = 0.0  # std of Gaussian noise added to every token's teacher gap before any rule reads it
    gap_noise_rho: float = 0.0  # that noise's AR(1) correlation along each response (0: i.i.d.), in (-1, 1)
    negate_gap: bool = False  # the negative control: every teacher gap negated (the teacher's preference reversed)


# the env and eval sections are made at import (their keys come from the env kinds' registry): a type
# checker cannot know their fields, so it sees them as Any; OmegaConf reads the dataclasses themselves
if TYPE_CHECKING:
    EnvSection = Any
    EvalSection = Any
else:
    EnvSection, EvalSection = EnvConfig, EvalConfig


@dataclass
class TrainConfig:
    preset: str = "tiny-cpu"
    method: str = "pcsd"  # a Table 1 method (pcsd.train.methods); sets algo.grpo/distill/skills and rule
    rule: str = "pcsd"
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvSection = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalSection = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)


def _kind_choices() -> dict[str, tuple[Any, ...]]:
    """``env.name`` and the choices of the env kinds' own keys (pcsd.envs.registry)."""
    from pcsd.envs import registry

    out: dict[str, tuple[Any, ...]] = {"env.name": registry.choices()}
    for where in ("env", "eval"):
        out.update({k.dotted: k.choices for k in registry.config_keys(where) if k.choices})
    return out


CHOICES: dict[str, tuple[str, ...]] = {
    **_kind_choices(),
    "rollout.backend": ("vllm", "hf"),
    "algo.loss_agg": ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum"),
    "algo.teacher": ("frozen", "current"),
    "algo.teacher_context": ("env", "group-success"),
    "algo.group_stats": ("trajectory", "row"),
    "algo.gigpo.norm": ("mean_std", "mean"),
    "model.param_dtype": ("float32", "bfloat16"),
    "model.compute_dtype": ("float32", "bfloat16"),
    "model.teacher_dtype": ("float32", "bfloat16"),
    "model.export_dtype": ("float32", "bfloat16"),
    "model.attn_impl": ("auto", "flash", "flex", "sdpa-padded"),
    "eval.protocol": ("full", "paper"),
    "optim.sft_schedule": ("cosine", "constant"),
    "optim.sft_navigation": ("plan", "sweep"),
    "optim.sft_teacher_demos": ("same", "skills"),
    "optim.joint_frozen_pass": ("auto", "always", "never"),
    "run.device": ("auto", "cpu", "cuda"),
    "dist.mesh": ("hsdp", "flat"),
}


#: keys that no longer exist -> what replaced them (a config naming one is refused with this text)
REPLACED: dict[str, str] = {
    "model.dtype": (
        "model.dtype was replaced by four keys that say what they set: model.param_dtype (the trained "
        "weights and AdamW state, float32 = master weights), model.compute_dtype (forward/backward "
        "under autocast, bfloat16 on GPUs), model.teacher_dtype (the frozen teacher/reference copy) "
        "and model.export_dtype (final-model/). The old model.dtype=bfloat16 is model.param_dtype="
        "float32 model.compute_dtype=bfloat16 model.teacher_dtype=bfloat16 model.export_dtype=bfloat16"
    ),
}


def _check_replaced(keys: list[str], where: str) -> None:
    for k in keys:
        if k in REPLACED:
            raise ConfigError(f"{k} ({where}) is no longer a config key: {REPLACED[k]}")


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


def unknown_key_message(key: str) -> str:
    """One line for a key the schema does not have: the closest keys ("did you mean"), and the keys
    of its group (``optim.*``), not every key."""
    import difflib

    keys = valid_keys()
    near = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    group = key.split(".")[0]
    mine = [k for k in keys if k.startswith(group + ".")]
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    if mine:
        return f"unknown config key {key!r}{hint} (the keys of {group}: {', '.join(mine)})"
    groups = sorted({k.split(".")[0] for k in keys if "." in k})
    return f"unknown config key {key!r}{hint} (the groups: {', '.join(groups)}; docs/configuration.md lists every key)"


def _merged(*parts: Any) -> DictConfig:
    """``OmegaConf.merge`` onto the schema (a mapping, so the result is one)."""
    out = OmegaConf.merge(*parts)
    if not isinstance(out, DictConfig):
        raise TypeError(f"a config merge gave a {type(out).__name__}, not a mapping")
    return out


def _container(node: Any) -> dict[str, Any]:
    """A config section as a plain dict (``OmegaConf.to_container`` of a mapping)."""
    out = OmegaConf.to_container(node)
    if not isinstance(out, dict):
        raise TypeError(f"expected a config mapping, got a {type(out).__name__}")
    return {str(k): v for k, v in out.items()}


# Keys a resumed run may change without changing what the run computes.
RESUME_MUTABLE: tuple[str, ...] = (
    "run.resume",
    "run.dir",
    "run.save_every",
    "run.keep_last",
    "run.stop_after",
    "run.log_every",
    "run.record_gaps",
    "run.log_episodes",
    "run.log_eval_failures",
    "run.episodes_max_mb",
    "run.wandb",
    "env.num_threads",
    "run.overwrite",
)

# a resumed run may continue on another machine, where vLLM's share of each GPU differs
RESUME_MUTABLE += ("rollout.gpu_memory_utilization", "rollout.sync_bucket_mb")
# or on another layout of nodes (checkpoints hold full, unsharded states)
RESUME_MUTABLE += ("dist.mesh",)


def _cli_value(overrides: list[str], key: str) -> Optional[str]:
    val = None
    for o in overrides:
        k, v = o.split("=", 1)
        if k.strip() == key:
            val = v.strip()
    return val


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The schema's defaults as a struct config (an env's constructor arguments take any names).
    Built once (it is most of a config read's time); callers never change it: they merge onto it,
    and ``OmegaConf.merge`` copies its first config."""
    cfg = OmegaConf.structured(TrainConfig)
    OmegaConf.set_struct(cfg, True)
    for node in (cfg.env.kwargs, cfg.env.eval_kwargs):
        OmegaConf.set_struct(node, False)
    return cfg


def load_config(overrides: list[str] | None = None, base: Optional[DictConfig] = None) -> DictConfig:
    """Schema defaults <- preset file <- method overrides <- dotted ``key=value`` overrides,
    validated. With ``base`` (a saved run's config, for resuming) the preset and method steps are
    skipped: schema <- ``base`` <- overrides."""
    from pcsd.train.methods import available_methods, canonical_method, method_overrides

    overrides = list(overrides or [])
    for o in overrides:
        if "=" not in o:
            groups = sorted({k.split(".")[0] for k in valid_keys() if "." in k})
            raise ConfigError(
                f"override {o!r} is not key=value (e.g. optim.steps=10); the keys are in the groups "
                f"{', '.join(groups)} (docs/configuration.md), and preset=, method="
            )
    _check_replaced([o.split("=", 1)[0].strip() for o in overrides], "override")
    if base is not None:
        _check_replaced(list(_flatten(OmegaConf.to_container(base))), "saved config")
    preset = _cli_value(overrides, "preset") or "tiny-cpu"
    if base is None and preset not in available_presets():
        raise ConfigError(f"unknown preset {preset!r}; valid presets: {', '.join(available_presets())}")
    cfg = _schema()  # shared: every step below merges, and OmegaConf.merge copies its first config
    try:
        if base is not None:
            cfg = _merged(cfg, base)
        else:
            preset_cfg = OmegaConf.load(PRESET_DIR / f"{preset}.yaml")
            if "experiment" in preset_cfg:
                raise ConfigError(
                    f"preset {preset}: experiment.* are experiment settings (docs/evidence.md), given on the "
                    "command line only, never in a preset"
                )
            _check_replaced(list(_flatten(OmegaConf.to_container(preset_cfg))), f"preset {preset}")
            cfg = _merged(cfg, preset_cfg)
            env_name = _cli_value(overrides, "env.name")
            if env_name is not None and env_name != cfg.env.name:  # another env than the preset's
                cfg = _without_env_keys(cfg)
            else:  # the preset's env kind; the settings of its env class go when the command line names another
                from pcsd.envs import registry

                named = {o.split("=", 1)[0].strip(): o.split("=", 1)[1].strip() for o in overrides}
                kind = registry.get(str(cfg.env.name)) if cfg.env.name in registry.available() else None
                gone = kind.replaced_keys(cfg, named) if kind is not None else ()
                if gone:
                    cfg = _without_env_keys(cfg, gone)
            method = _cli_value(overrides, "method") or cfg.method
            try:
                method = canonical_method(method)
            except ValueError:
                raise ConfigError(
                    f"unknown method {method!r}; valid methods: {', '.join(available_methods())}"
                ) from None
            ov = method_overrides(method)
            ov["method"] = method
            cfg = _merged(cfg, OmegaConf.from_dotlist([f"{k}={v}" for k, v in ov.items()]))
            overrides = [o for o in overrides if o.split("=", 1)[0].strip() != "method"]
        cfg = _merged(cfg, OmegaConf.from_dotlist(overrides))
    except (ConfigAttributeError, ConfigKeyError) as exc:
        key = getattr(exc, "full_key", None) or str(exc).split("\n")[0]
        raise ConfigError(unknown_key_message(str(key))) from None
    except OmegaConfBaseException as exc:
        raise ConfigError(
            f"bad config value: {str(exc).splitlines()[0]} (key {getattr(exc, 'full_key', '?')!r})"
        ) from None
    _validate(cfg)
    _check_method_keys(cfg, {o.split("=", 1)[0].strip() for o in overrides})
    return cfg


def env_kind_keys() -> tuple[str, ...]:
    """The keys of one kind of environment (the kinds' own, and the skills folder): ``env.name=X``
    on the command line, naming another env than the preset's, returns them to their defaults (the
    preset's games, data, skills and env class are its own env's, not X's); every other key of the
    preset stays."""
    from pcsd.envs import registry

    return tuple(k.name for k in registry.config_keys("env")) + ("skills_dir",)


def _without_env_keys(cfg: DictConfig, keys: Optional[tuple[str, ...]] = None) -> DictConfig:
    defaults = EnvConfig()
    out = _merged(cfg, {})
    for k in env_kind_keys() if keys is None else keys:
        OmegaConf.update(out, f"env.{k}", getattr(defaults, k), merge=False)
    for node in (out.env.kwargs, out.env.eval_kwargs):
        OmegaConf.set_struct(node, False)
    return out


def config_diff(a: DictConfig, b: DictConfig) -> list[str]:
    """Dotted keys whose resolved values differ between two configs."""
    fa = _flatten(OmegaConf.to_container(a, resolve=True))
    fb = _flatten(OmegaConf.to_container(b, resolve=True))
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_config(run_dir: str | Path, overrides: list[str] | None = None) -> DictConfig:
    """The config of a run being resumed: its saved ``config.yaml`` <- ``overrides``; an override
    that changes a key outside :data:`RESUME_MUTABLE` is a ConfigError naming it."""
    run = Path(run_dir)
    saved_path = run / "config.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"run.resume={run}: no config.yaml there (not a pcsd run directory)")
    try:
        saved = OmegaConf.load(saved_path)
    except Exception as exc:  # yaml's ScannerError / ParserError, OmegaConf's errors, undecodable bytes
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"run.resume={run}: {saved_path} is not a readable config ({first})") from None
    if not isinstance(saved, DictConfig):
        raise ConfigError(f"run.resume={run}: {saved_path} is not a config (a YAML mapping of keys)")
    if (_cli_value([o for o in (overrides or []) if "=" in o], "run.overwrite") or "").lower() in ("true", "1", "yes"):
        raise ConfigError(
            "run.overwrite=true starts a new run in the folder, --resume continues the run there: give one of them"
        )
    overrides = [o for o in (overrides or []) if o.split("=", 1)[0].strip() not in ("run.resume", "run.dir")]
    # the saved run.overwrite belonged to its start; a resumed run never moves its own folder's content
    overrides.append("run.overwrite=false")
    for o in overrides:
        if "=" in o and o.split("=", 1)[0].strip() in ("preset", "method"):
            k, v = o.split("=", 1)
            if v.strip() != str(saved.get(k.strip())):
                raise ConfigError(
                    f"cannot resume {run} with {k.strip()}={v.strip()}: the run was made with "
                    f"{k.strip()}={saved.get(k.strip())} (changing it changes the run)"
                )
    overrides = [o for o in overrides if o.split("=", 1)[0].strip() not in ("preset", "method")]
    cfg = load_config(overrides + [f"run.dir={run.resolve()}", f"run.resume={run.resolve()}"], base=saved)
    with warnings.catch_warnings():  # the same config again: its warnings were given just above
        warnings.simplefilter("ignore", ConfigWarning)
        reference = load_config([f"run.dir={run.resolve()}", f"run.resume={run.resolve()}"], base=saved)
    bad = [k for k in config_diff(cfg, reference) if k not in RESUME_MUTABLE]
    if bad:
        changes = ", ".join(f"{k}: {OmegaConf.select(reference, k)!r} -> {OmegaConf.select(cfg, k)!r}" for k in bad)
        raise ConfigError(
            f"cannot resume {run}: these overrides change the run's meaning: {changes} "
            f"(a resumed run may change only {', '.join(RESUME_MUTABLE)})"
        )
    return cfg


def _check_rule_pins(cfg: DictConfig) -> None:
    """A rule defined by a parameter the trainer would otherwise take from ``algo.pcsd`` (e.g.
    pcsd-fixed-n4 is n_min=4): the config must agree, or the run is not that rule."""
    from pcsd.ops.weighting import get_rule

    for k, v in get_rule(cfg.rule).pins.items():
        if cfg.algo.pcsd[k] != v:
            raise ConfigError(
                f"rule={cfg.rule} is defined by algo.pcsd.{k}={v}, but the config has "
                f"algo.pcsd.{k}={cfg.algo.pcsd[k]}; use method={cfg.rule} (sets both) "
                f"or set algo.pcsd.{k}={v}"
            )


def _check_method_keys(cfg: DictConfig, cli_keys: set[str]) -> None:
    """One :class:`ConfigWarning` per method key that has no effect under the config's method
    (:func:`pcsd.train.methods.unused_keys`) and that this command line sets, or that holds a value
    other than the schema's default (set by the preset or a saved config). A warning, not an error:
    a preset sets the PCSD keys for every method and the same overrides are applied across methods
    (benchmarks/compare_methods.py), so switching the method must keep working; nothing that
    changes what is computed is silent. A run without RL steps (a warm-up, an evaluation, shared by
    every method) reads no method key and is not checked."""
    from pcsd.train.methods import unused_keys

    if cfg.optim.steps == 0:
        return
    defaults = _flatten(dataclasses.asdict(TrainConfig()))
    for key, why in unused_keys(cfg).items():
        val = OmegaConf.select(cfg, key)
        # a preset's skills folder serves its methods with a teacher: switching to one without is
        # said only when the command line names the folder (the folder is then not checked either)
        from_preset_only = key == "env.skills_dir" and key not in cli_keys
        if key in cli_keys or (val != defaults.get(key) and not from_preset_only):
            warnings.warn(f"{key}={val} has no effect under method={cfg.method}: {why}", ConfigWarning, stacklevel=3)


def _validate(cfg: DictConfig) -> None:
    from pcsd.ops.weighting import available_rules
    from pcsd.train.methods import available_methods

    if cfg.method not in available_methods():
        raise ConfigError(f"method={cfg.method!r} is not valid; choose one of {', '.join(available_methods())}")

    for key, choices in CHOICES.items():
        val = OmegaConf.select(cfg, key)
        if val not in choices:
            raise ConfigError(f"{key}={val!r} is not valid; choose one of {', '.join(choices)}")
    if cfg.rule not in available_rules():
        raise ConfigError(f"rule={cfg.rule!r} is not valid; choose one of {', '.join(available_rules())}")
    _validate_estimator(cfg)
    _check_rule_pins(cfg)
    positive = [
        "rollout.tasks_per_step",
        "rollout.group_size",
        "rollout.max_prompt_tokens",
        "rollout.max_response_tokens",
        "env.max_steps",
        "optim.tokens_per_microbatch",
        "optim.ppo_epochs",
        "optim.sft_batch_size",
        "rollout.sync_bucket_mb",
        "algo.teacher_context_tokens",
    ]
    for key in positive:
        if OmegaConf.select(cfg, key) <= 0:
            raise ConfigError(f"{key} must be > 0, got {OmegaConf.select(cfg, key)}")
    for key in ["run.save_every", "run.keep_last", "run.stop_after", "optim.sft_games"]:
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {OmegaConf.select(cfg, key)}")
    for key in [
        "optim.steps",
        "env.history_length",
        "algo.lambda_distill",
        "algo.kl_beta",
        "optim.lr",
        "optim.grad_clip",
        "rollout.temperature",
        "eval.episodes",
        "optim.sft_prompt_weight",
        "eval.batch_size",
    ]:
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {OmegaConf.select(cfg, key)}")
    if cfg.optim.sft_steps > 0 and cfg.optim.sft_games < 1:
        raise ConfigError(f"optim.sft_games must be >= 1 when optim.sft_steps > 0, got {cfg.optim.sft_games}")
    if not 0 <= cfg.optim.sft_teacher_share <= 1:
        raise ConfigError(f"optim.sft_teacher_share must be in [0, 1], got {cfg.optim.sft_teacher_share}")
    _validate_skills(cfg)
    if not isinstance(cfg.run.record_gaps, bool):
        raise ConfigError(f"run.record_gaps must be true or false, got {cfg.run.record_gaps!r}")
    _validate_records(cfg)
    if not 0 < cfg.algo.clip_eps < 1:
        raise ConfigError(f"algo.clip_eps must be in (0, 1), got {cfg.algo.clip_eps}")
    _validate_ranges(cfg)
    _validate_scales(cfg)
    _validate_run_inputs(cfg)
    _validate_sizes(cfg)
    _validate_env(cfg)
    if not (cfg.algo.grpo or cfg.algo.distill or cfg.optim.steps == 0):
        raise ConfigError(
            "algo.grpo and algo.distill are both false: nothing to train (use optim.steps=0 for the Vanilla baseline)"
        )


def _validate_records(cfg: DictConfig) -> None:
    """The episode records' bounds and ``run.wandb`` (its package must be there)."""
    from pcsd.train.metrics import WANDB_INSTALL, wandb_missing

    for key in ("run.log_episodes", "run.log_eval_failures"):
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0 (0: none), got {OmegaConf.select(cfg, key)}")
    if not cfg.run.episodes_max_mb > 0:
        raise ConfigError(f"run.episodes_max_mb must be > 0, got {cfg.run.episodes_max_mb}")
    if not isinstance(cfg.run.wandb, bool):
        raise ConfigError(f"run.wandb must be true or false, got {cfg.run.wandb!r}")
    if cfg.run.wandb and wandb_missing():
        raise ConfigError(f"run.wandb=true needs the wandb package, which is not installed: {WANDB_INSTALL}")


#: run.seed's range: numpy's generators (the paper protocol's draws) take seeds below 2**32, and the
#: rollout seeds derived from it ((seed * 100_000 + step) * ranks + rank) must stay in int64
MAX_SEED = 2**31 - 1


def _validate_estimator(cfg: DictConfig) -> None:
    """``algo.estimator``, ``algo.policy_loss`` (the registries' names), their parameters, the
    upper clip and dynamic sampling."""
    from pcsd.ops.estimators import available_estimators
    from pcsd.ops.policy_losses import available_policy_losses

    for key, names in (("algo.estimator", available_estimators()), ("algo.policy_loss", available_policy_losses())):
        if OmegaConf.select(cfg, key) not in names:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)!r} is not valid; choose one of {', '.join(names)}")
    g = cfg.algo.gigpo
    if not 0 <= g.gamma <= 1:
        raise ConfigError(f"algo.gigpo.gamma must be in [0, 1], got {g.gamma}")
    if not g.step_weight >= 0:
        raise ConfigError(f"algo.gigpo.step_weight must be >= 0, got {g.step_weight}")
    high = cfg.algo.clip_eps_high
    if high is not None and not high > 0:
        raise ConfigError(f"algo.clip_eps_high must be > 0 (the upper clip is 1 + clip_eps_high), got {high}")
    if cfg.rollout.max_sample_batches < 1:
        raise ConfigError(f"rollout.max_sample_batches must be >= 1, got {cfg.rollout.max_sample_batches}")
    if cfg.rollout.dynamic_sampling and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"rollout.dynamic_sampling=true drops groups whose rewards are all equal, and a group of "
            f"rollout.group_size={cfg.rollout.group_size} always is: use groups of >= 2 rollouts"
        )


def _validate_sizes(cfg: DictConfig) -> None:
    """Sizes a run would otherwise meet late or never: the batches dynamic sampling may play in one
    step, the upper clip against the lower one, and the LoRA rank against the model's width (the
    tiny model's, or a model folder's that can be read now; else :func:`lora_rank_problem` when the
    run reads the model's config, before the warm-up writes anything)."""
    from pcsd.train.sampling import MAX_SAMPLE_BATCHES

    n = cfg.rollout.max_sample_batches
    if n > MAX_SAMPLE_BATCHES:
        raise ConfigError(
            f"rollout.max_sample_batches must be <= {MAX_SAMPLE_BATCHES} (each further batch plays "
            f"rollout.tasks_per_step more groups in the same step), got {n}"
        )
    p = cfg.rollout.max_privileged_tokens
    if p is not None and p < 1:
        raise ConfigError(f"rollout.max_privileged_tokens must be >= 1 (null: no budget), got {p}")
    high, low = cfg.algo.clip_eps_high, cfg.algo.clip_eps
    if high is not None and high < low:
        raise ConfigError(
            f"algo.clip_eps_high={high} is below algo.clip_eps={low}: the upper clip 1 + clip_eps_high is "
            f"clip-higher (DAPO: 0.28 over 0.2), at least clip_eps; set it >= {low} or null (= clip_eps)"
        )
    if cfg.model.lora_rank > 0:
        folder = _model_folder_now(cfg.model.path)
        problem = None
        if cfg.model.path is None:
            problem = lora_rank_problem(cfg.model.lora_rank, int(cfg.model.tiny_hidden_size), "the tiny model")
        elif folder is not None:
            problem = lora_rank_problem(cfg.model.lora_rank, folder)
        if problem:
            raise ConfigError(problem)


def lora_rank_problem(rank: int, model: Path | int, what: Optional[str] = None) -> Optional[str]:
    """Why ``model.lora_rank`` does not fit the model (``model``: its folder, whose ``config.json``
    gives ``hidden_size``, or the width itself), or None: a rank above the model's width makes
    adapters larger than the full-rank update they stand for (and can exhaust memory)."""
    import json

    if isinstance(model, int):
        width: Optional[int] = model
    else:
        try:
            conf = json.loads((Path(model) / "config.json").read_text())
            conf = conf.get("text_config", conf) if isinstance(conf, dict) else {}
            width = int(conf["hidden_size"])
        except (OSError, ValueError, KeyError, TypeError):
            width = None  # the model's load says what is wrong with its config
        what = what or str(model)
    if width is None or rank <= width:
        return None
    return (
        f"model.lora_rank={rank} is larger than the model's width ({what}: hidden_size={width}): adapters of "
        f"that rank hold more than the full-rank update; choose a rank <= {width} (LoRA ranks are usually 8-128)"
    )


#: the largest magnitude of a reward or loss-weight setting (:func:`_validate_scales`): rewards and
#: advantages are float32, and a reward times a weight times a group's sum must stay far below
#: float32's 3.4e38 (1e6 * 1e6 * the largest batch is still 1e15 or so)
MAX_SCALE = 1e6
#: the smallest sampling temperature (logits / temperature must stay finite in float32; vLLM samples
#: greedily below it)
MIN_TEMPERATURE = 1e-5


def _validate_scales(cfg: DictConfig) -> None:
    """The reward and weight settings that scale float32 values (rewards, advantages, the loss, the
    logits): finite Python floats such as 1e300 overflow float32 (-inf rewards, NaN losses and
    weights), so each has a bound, one line naming it; ``optim.max_nonfinite_updates``."""
    scales = {
        "rollout.invalid_action_penalty": cfg.rollout.invalid_action_penalty,
        "algo.success_reward": cfg.algo.success_reward,
        "algo.gigpo.step_weight": cfg.algo.gigpo.step_weight,
        "algo.lambda_distill": cfg.algo.lambda_distill,
        "algo.kl_beta": cfg.algo.kl_beta,
    }
    for key, val in scales.items():
        if not abs(val) <= MAX_SCALE:
            raise ConfigError(
                f"{key}={val} is too large: rewards, advantages and the loss are float32, so a reward or "
                f"weight must be at most {MAX_SCALE:g} in magnitude"
            )
    for key in ("rollout.temperature", "eval.temperature"):
        val = OmegaConf.select(cfg, key)
        if 0 < val < MIN_TEMPERATURE and not (key == "eval.temperature" and cfg.eval.greedy):
            raise ConfigError(
                f"{key}={val} is too small: logits / temperature overflow float32 below {MIN_TEMPERATURE:g} "
                "(eval.greedy=true plays greedily)"
            )
    if cfg.optim.max_nonfinite_updates < 1:
        raise ConfigError(
            f"optim.max_nonfinite_updates must be >= 1 (updates not applied in a row before the run stops), "
            f"got {cfg.optim.max_nonfinite_updates}"
        )


def _validate_run_inputs(cfg: DictConfig) -> None:
    """Seeds, thread counts, the tiny model's shape, the env pool's size and the model folder: what
    would otherwise fail after the warm-up (or not at all), checked when the config is read."""
    import os

    from pcsd.envs.pool import MAX_ENVS
    from pcsd.models import check_model_dir

    if not 0 <= cfg.run.seed <= MAX_SEED:
        raise ConfigError(f"run.seed must be in [0, {MAX_SEED}], got {cfg.run.seed}")
    for key in ("env.num_threads", "optim.sft_steps"):
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {OmegaConf.select(cfg, key)}")
    if cfg.model.path is None:  # the generated tiny model: heads of hidden_size // 32 (>= 32) dimensions
        h = cfg.model.tiny_hidden_size
        if h < 32 or h % max(1, h // 32):
            raise ConfigError(
                f"model.tiny_hidden_size must be >= 32 and divisible by its head count (hidden_size "
                f"// 32, heads of >= 32 dimensions), e.g. a multiple of 32; got {h}"
            )
        if cfg.model.tiny_layers < 1:
            raise ConfigError(f"model.tiny_layers must be >= 1, got {cfg.model.tiny_layers}")
    ws = os.environ.get("WORLD_SIZE", "1")
    ranks = int(ws) if ws.isdigit() and int(ws) > 0 else 1
    envs = -(-cfg.rollout.tasks_per_step // ranks) * cfg.rollout.group_size
    if envs > MAX_ENVS:
        raise ConfigError(
            f"rollout.tasks_per_step x rollout.group_size = {envs} envs per rank, more than the env "
            f"pool holds ({MAX_ENVS}); lower rollout.tasks_per_step or rollout.group_size"
        )
    folder = _model_folder_now(cfg.model.path)
    if folder is not None:
        problem = check_model_dir(folder, weights=False)  # no weights: --plan needs none, a run's load says so
        if problem:
            raise ConfigError(f"model.path: {problem}")
        if (folder / "tokenizer.json").is_file():
            from pcsd.envs import registry
            from pcsd.text.prompts import PromptBuilder

            kind = registry.get(str(cfg.env.name))
            try:
                template = kind.template(cfg)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            try:
                builder = PromptBuilder(
                    kind.prompt,
                    history_length=0,
                    max_prompt_tokens=None,
                    tokenizer_dir=str(folder),
                    enable_thinking=cfg.model.enable_thinking,
                    template=template,
                )
            except (OSError, ValueError) as exc:
                raise ConfigError(f"model.path={cfg.model.path}: its tokenizer does not load ({exc})") from None
            problem = prompt_budget_problem(builder, cfg.rollout.max_prompt_tokens)
            if problem:
                raise ConfigError(problem)


def _model_folder_now(path) -> Optional[Path]:
    """The folder ``model.path`` names that can be read now without a download: a checkpoint
    folder with ``config.json``, or a Hugging Face model id's snapshot already in the cache; else
    None (the id's own check, :func:`pcsd.models.check_model_spec`, and the load say what is wrong)."""
    from pcsd.models import ModelNotFound, is_model_id, resolve_model_path

    if path is None:
        return None
    p = Path(str(path)).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p
    if not is_model_id(str(path)):
        return None
    try:
        return resolve_model_path(str(path), download=False)
    except ModelNotFound:
        return None


def prompt_budget_problem(builder, max_prompt_tokens: int, key: str = "rollout.max_prompt_tokens") -> Optional[str]:
    """Why ``max_prompt_tokens`` can hold no prompt of ``builder``'s template (a
    :class:`pcsd.text.prompts.PromptBuilder` with a tokenizer), or None."""
    least = builder.min_prompt_tokens()
    if least is None or max_prompt_tokens >= least:
        return None
    return (
        f"{key}={max_prompt_tokens} cannot hold a single prompt: the {builder.env} template alone (no history, a "
        f"one-letter task, an empty observation, no actions) is {least} tokens under this model's chat template; "
        f"raise it well above {least} (observations and admissible actions come on top)"
    )


def response_budget_problem(builder, episodes, cfg: DictConfig) -> Optional[str]:
    """Why ``rollout.max_response_tokens`` cannot hold the warm-up's longest target (the expert's
    step as the warm-up teaches it: ``<think>…</think><action>…</action>`` and the end of turn,
    under ``builder``'s tokenizer), or None: a response cut before ``</action>`` is never a valid
    action, so a warm-up that teaches longer ones leaves the run at 0 valid actions."""
    from pcsd.train.sft import longest_target

    n, text = longest_target(builder, episodes)
    budget = int(cfg.rollout.max_response_tokens)
    if n <= budget:
        return None
    return (
        f"rollout.max_response_tokens={budget} is shorter than the warm-up's targets: the longest is {n} tokens "
        f"({text!r} and the end of turn); every sampled action would be cut before </action> (invalid): raise "
        f"rollout.max_response_tokens to at least {n}"
    )


def warmup_problem(kind: Any, episodes: list, demonstrations: list, cfg: DictConfig) -> Optional[str]:
    """Why the warm-up has nothing to learn from (the kind's expert played ``episodes`` and none of
    them is a demonstration: none won within ``env.max_steps``), or None. Checked when the expert's
    episodes are played, before the run writes its model."""
    if cfg.optim.sft_steps <= 0 or not episodes or demonstrations:
        return None
    return (
        f"env.max_steps={cfg.env.max_steps}: the {kind.title or kind.name} expert won none of the warm-up's "
        f"{len(episodes)} episodes within that many steps, so the warm-up (optim.sft_steps={cfg.optim.sft_steps}) "
        "has no example; raise env.max_steps or set optim.sft_steps=0"
    )


def resolve_skills_dir(value: str) -> Path:
    """``env.skills_dir`` as a folder: absolute, else relative to the current folder if it exists
    there, else relative to the presets' folder (``pcsd/train/configs/``)."""
    return resolve_config_path(value)


def _validate_skills(cfg: DictConfig) -> None:
    """``optim.sft_teacher_demos``: the skill-reading expert's examples need a share of them."""
    if cfg.optim.sft_teacher_demos == "skills" and cfg.optim.sft_teacher_share <= 0:
        raise ConfigError(
            "optim.sft_teacher_demos=skills shows the skill-reading expert in the teacher's-prompt "
            "examples, of which there are none: set optim.sft_teacher_share > 0"
        )


def _check_response_budget(cfg: DictConfig, kind: Any) -> None:
    """With a model whose tokenizer can be read now, the warm-up's target for the expert step the
    env's check played (:meth:`pcsd.envs.kind.EnvKind.expert_sample`) must fit
    ``rollout.max_response_tokens``; the generated tiny model's tokenizer is made with the run, which
    checks every target then (:func:`response_budget_problem`, before the warm-up)."""
    if cfg.optim.sft_steps <= 0:
        return
    sample = kind.expert_sample(cfg)
    folder = _model_folder_now(cfg.model.path)
    if sample is None or folder is None or not (folder / "tokenizer.json").is_file():
        return
    from pcsd.envs.experts import ExpertEpisode
    from pcsd.text.prompts import PromptBuilder

    task, observation, action = sample
    builder = PromptBuilder(kind.prompt, history_length=0, max_prompt_tokens=None, tokenizer_dir=str(folder))
    problem = response_budget_problem(builder, [ExpertEpisode(task, "", steps=[(observation, [], action)])], cfg)
    if problem:
        raise ConfigError(problem)


def skills_readers(cfg: DictConfig) -> tuple[bool, bool]:
    """``(teacher, student)``: whether a teacher's prompt reads privileged context (a method that
    trains with distillation or RLSD; the warm-up's examples in the teacher's prompt), and whether
    the student's prompts show the skills (Skill-GRPO, the starred evaluations)."""
    trains = cfg.optim.steps > 0
    warm_teacher = cfg.optim.sft_steps > 0 and cfg.optim.sft_teacher_share > 0
    return (
        bool((trains and cfg.algo.distill) or warm_teacher),
        bool((trains and cfg.algo.student_skills) or cfg.eval.skills),
    )


def _validate_env(cfg: DictConfig) -> None:
    """The env kind's keys and checks (pcsd.envs.kind), then the teacher's context: a skills folder
    (checked when the method reads one), the kind's built-in skills, or the env's own privileged
    text (a teacher only: the student never sees it)."""
    from pcsd.envs import registry

    kind = registry.get(str(cfg.env.name))
    values = {
        k.dotted: OmegaConf.select(cfg, k.dotted) for k in registry.config_keys("env") + registry.config_keys("eval")
    }
    problem = registry.foreign_key_problem(kind, values) or kind.check(cfg)
    if problem:
        raise ConfigError(problem)
    _check_response_budget(cfg, kind)
    teacher, student = skills_readers(cfg)
    if cfg.env.skills_dir is not None:
        if not (teacher or student):
            return  # not read by this method (warned about: pcsd.train.methods.unused_keys)
        from pcsd.text.prompts import SkillRepository

        try:
            SkillRepository(resolve_skills_dir(cfg.env.skills_dir), kind.prompt)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"env.skills_dir={cfg.env.skills_dir}: {exc}") from None
        return
    if kind.builtin_skills:
        return
    where = "set env.skills_dir to a skills folder (docs/environments.md, 'What the teacher knows')"
    if student:
        raise ConfigError(
            f"env.skills_dir: method {cfg.method} shows the skills in the student's prompts, and env.name={kind.name} "
            f"has none built in: {where} (an env's info['privileged'] is the teacher's alone), or train without "
            "them (method=grpo)"
        )
    if teacher and not kind.gives_privileged(cfg) and cfg.algo.teacher_context != "group-success":
        raise ConfigError(
            f"env.skills_dir: method {cfg.method} reads the teacher's skills, and env.name={kind.name} has none "
            f"built in and the env gives no info['privileged']: {where}, have the env give the teacher its "
            "privileged text (info['privileged']), take it from the group's successes "
            "(algo.teacher_context=group-success), or train without a teacher (method=grpo)"
        )


def _validate_ranges(cfg: DictConfig) -> None:
    """Every hyperparameter with a valid range, checked when the config is read (not at the first
    update hours later); PCSD's parameters with the op's own messages."""
    import math

    from pcsd.ops.kernels import check_pcsd_params
    from pcsd.ops.weighting import get_rule
    from pcsd.train import precision

    flat = _flatten(OmegaConf.to_container(cfg, resolve=True))
    for key, val in flat.items():
        if isinstance(val, float) and not math.isfinite(val):
            raise ConfigError(f"{key}={val} must be a finite number")
    # PCSD: n_min / n_max / alpha / tau_low / tau_high / gamma / beta_gate, as the op checks them
    base = get_rule("pcsd").defaults
    params = {**base, **{k: v for k, v in _container(cfg.algo.pcsd).items() if k in base}}
    try:
        check_pcsd_params(**params)
    except ValueError as exc:
        raise ConfigError(f"algo.pcsd: {exc}") from None
    exp = cfg.experiment
    if exp.gap_noise < 0:
        raise ConfigError(f"experiment.gap_noise must be >= 0 (a standard deviation), got {exp.gap_noise}")
    if not -1.0 < exp.gap_noise_rho < 1.0:
        raise ConfigError(
            f"experiment.gap_noise_rho must be in (-1, 1) (an AR(1) correlation), got {exp.gap_noise_rho}"
        )
    positive = {
        "algo.adv_eps": cfg.algo.adv_eps,
        "rollout.temperature": cfg.rollout.temperature,
        "optim.grad_clip": cfg.optim.grad_clip,
    }
    if cfg.optim.steps > 0:
        positive["optim.lr"] = cfg.optim.lr
    if cfg.optim.sft_steps > 0:
        positive["optim.sft_lr"] = cfg.optim.sft_lr
    if not cfg.eval.greedy:
        positive["eval.temperature"] = cfg.eval.temperature
    for key, val in positive.items():
        if not val > 0:
            raise ConfigError(
                f"{key} must be > 0, got {val}"
                + (
                    " (sampling needs a temperature; eval.greedy=true plays greedily)"
                    if key.endswith("temperature")
                    else ""
                )
            )
    if not 0 < cfg.rollout.gpu_memory_utilization < 1:
        raise ConfigError(f"rollout.gpu_memory_utilization must be in (0, 1), got {cfg.rollout.gpu_memory_utilization}")
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {cfg.rollout.top_p}")
    for key in ("optim.weight_decay", "rollout.invalid_action_penalty", "eval.every"):
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {OmegaConf.select(cfg, key)}")
    if cfg.algo.grpo and cfg.optim.steps > 0 and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"rollout.group_size={cfg.rollout.group_size}: GRPO needs groups of >= 2 rollouts "
            f"per task (a group of one has advantage 0, nothing to learn)"
        )
    row = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    if cfg.optim.tokens_per_microbatch < row:
        raise ConfigError(
            f"optim.tokens_per_microbatch={cfg.optim.tokens_per_microbatch} is smaller than one "
            f"row (rollout.max_prompt_tokens + rollout.max_response_tokens = {row}); raise it to "
            f">= {row} or lower the prompt/response budgets"
        )
    problem = precision.check(cfg)
    if problem:
        raise ConfigError(problem)
    _validate_lora(cfg)
    if cfg.model.path is not None:  # a checkpoint folder, or a Hugging Face model id (cached, or offline: must be)
        from pcsd.models import ModelNotFound, check_model_spec

        try:
            check_model_spec(str(cfg.model.path))
        except ModelNotFound as exc:
            raise ConfigError(str(exc)) from None


#: model types whose decoder layers name their linear layers as :data:`pcsd.lora.DEFAULT_TARGETS`
#: (the generated tiny model is a Qwen2); other models' targets are checked when the model loads
LORA_FAMILIES = ("qwen2", "qwen3", "llama", "mistral")


def _validate_lora(cfg: DictConfig) -> None:
    """``model.lora_rank`` / ``lora_alpha`` / ``lora_targets`` / ``lora_dropout``: ranges, target
    names (against the Llama/Qwen family's projections when the model is of it), keys that would
    have no effect, and the teacher's dtype (a LoRA run's teacher is the base in the compute dtype)."""
    import json

    from pcsd.lora import DEFAULT_TARGETS

    m = cfg.model
    if m.lora_rank < 0:
        raise ConfigError(f"model.lora_rank must be >= 0 (0: no LoRA), got {m.lora_rank}")
    if m.lora_alpha is not None and not m.lora_alpha > 0:
        raise ConfigError(f"model.lora_alpha must be > 0 (or null: the rank), got {m.lora_alpha}")
    if not 0 <= m.lora_dropout < 1:
        raise ConfigError(f"model.lora_dropout must be in [0, 1), got {m.lora_dropout}")
    if m.lora_rank == 0:
        for key, default in (("lora_alpha", None), ("lora_targets", None), ("lora_dropout", 0.0)):
            if m[key] != default:
                raise ConfigError(f"model.{key}={m[key]} has no effect with model.lora_rank=0 (no LoRA); set a rank")
        return
    if m.lora_targets is not None:
        targets = list(m.lora_targets)
        if not targets:
            raise ConfigError(f"model.lora_targets is empty; give null (all) or some of {', '.join(DEFAULT_TARGETS)}")
        if len(set(targets)) != len(targets):
            raise ConfigError(f"model.lora_targets={targets} names a module twice")
        folder = _model_folder_now(m.path)
        family = "qwen2" if m.path is None else None
        if folder is not None:
            try:
                family = str(json.loads((folder / "config.json").read_text()).get("model_type", ""))
            except (OSError, ValueError):
                family = None
        if family in LORA_FAMILIES:
            for t in targets:
                if t not in DEFAULT_TARGETS:
                    raise ConfigError(
                        f"model.lora_targets has {t!r}, not a linear layer of a {family} decoder layer; "
                        f"choose from {', '.join(DEFAULT_TARGETS)}"
                    )
    if m.teacher_dtype != m.compute_dtype:
        raise ConfigError(
            f"model.teacher_dtype={m.teacher_dtype} with LoRA (model.lora_rank={m.lora_rank}): the teacher is the "
            f"base model itself, frozen in model.compute_dtype={m.compute_dtype}; set model.teacher_dtype="
            f"{m.compute_dtype}"
        )
