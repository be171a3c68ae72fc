"""``python -m pcsd.eval``: ALFWorld success per category and Overall, in the layout of the paper's Table 1.

    python -m pcsd.eval --model runs/tiny-cpu-pcsd-20261123 --split procedural --count 48
    python -m pcsd.eval --model /ckpt/pcsd-final --label PCSD --model /ckpt/grpo --label GRPO \\
        --split valid_seen,valid_unseen --backend vllm
    python -m pcsd.eval --model runs/x --split valid_seen --task-types Heat,Cool --count 10
    python -m pcsd.eval --model runs/x --games-file my_games.txt --greedy
    python -m pcsd.eval --model runs/x/final-adapter [--base /models/Qwen2.5-3B-Instruct]

A LoRA run (``model.lora_rank`` > 0) writes ``final-model/`` (the merged model) and
``final-adapter/`` (peft's format); ``--model`` takes either. An adapter folder needs its base
model: the one its ``adapter_config.json`` names, or ``--base``. The hf backend generates with the
adapter merged into the base; vLLM starts from the base and receives the merged weights.

Two protocols (:mod:`pcsd.eval.protocol`, ``docs/eval-protocol.md``):

* ``--protocol full`` (default): every game of the split (``valid_seen``: 140, ``valid_unseen``: 134,
  from ``$ALFWORLD_DATA/json_2.1.1``) or of a named subset (``--count``, ``--task-types``,
  ``--games-file``) is played exactly once, in sorted order, with fixed seeds, so two runs give
  the same table. ``--episodes N`` plays a stratified subset of N games (every category keeps its
  share). ``procedural`` is a fixed list of generated games (pcsd's embedded default).
* ``--protocol paper``: the paper's 128 episodes per validation, drawn with replacement exactly as
  verl-agent / SDAR draw their validation episodes (environment ``i`` seeded ``--draw-seed + 1000 +
  i``; ``--validation-index v`` is the v-th validation of a training run, 0 = before training).

Both print a 95 % Wilson interval for Overall under the table.

WebShop (``--split webshop``, alone or beside ALFWorld splits: ``--split valid_seen,webshop``):
``--episodes`` (default 128) distinct validation goals of the validation shop (``--draw-seed`` +
1000, verl-agent's seeding), drawn as verl-agent's validation manager draws them (``--protocol
paper``: validation ``--validation-index``; ``full``: always the first draw, fixed goals); data from
``--webshop-data``, else the run's ``env.webshop_data``, else ``$WEBSHOP_DATA``. Reports Score (100 x
mean task score) and Acc (% of episodes with score 1) in Table 1's WebShop columns. Defaults for a
model that was not trained on WebShop: 15 steps, prompts of 4,096 tokens.

A Python text environment (``--split env``, the default for a run trained on one: ``env.name=gym``,
...; ``docs/environments.md``): the run's environment (its ``env`` section, ``--env KEY=VALUE``
overriding keys, e.g. ``--env name=gym --env entry_point=examples.keydoor:KeyDoorEnv`` for a model
that is not a run), checked as the trainer checks it (one env built, reset and stepped first), on
``--episodes`` (default: the run's ``eval.episodes``, else 128) fixed evaluation seeds, the
trainer's own, with the run's prompt template (``<run>/template.jinja``). Reports Success and the
mean summed reward.

Skills (``--skills``, the starred rows): the student prompt starts with the skills, as the
teacher's does. They come from ``--skills-dir`` (a folder in the layout of ``env.skills_dir``), else,
for a run that trained with ``env.skills_dir``, from the copy the trainer keeps in ``<run>/skills/``,
else from the built-in skills.

Seeds: the games are played in batches of ``--batch-size`` (0 = all at once); a batch's sampling
seed is ``seed + crc32(name of its first game)``, so with ``--batch-size 1`` every game has its
own seed and its result does not depend on which other games are evaluated with it. A game's
name is its path below the split folder (real games) or its file name (procedural games).

Prompts over ``--max-prompt-tokens`` (default: the run's ``rollout.max_prompt_tokens``) are built
without their history; a prompt still over it ends that episode unwon (the training's rule,
:mod:`pcsd.rollout.loop`): each result's ``prompt_overflow``, the row's ``prompt_overflows`` and a
note under the table count them. A budget smaller than the template itself is refused.

Output: the markdown table on stdout and in ``<out>/table.md``, and ``<out>/results.json`` with
every game's result (game, task type, category, won, steps, seed). The trainer's evaluation
before and after RL calls :func:`evaluate`, the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from pcsd.envs import registry
from pcsd.eval.games import DEFAULT_SEED, RULE_LABELS, EvalError
from pcsd.eval.run import EvalResult, play_games, render_table
from pcsd.lora import ADAPTER_CONFIG, adapter_base, is_adapter_dir, load_merged
from pcsd.models import ModelNotFound, is_model_id, resolve_model_path

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from pcsd.text.prompts import EnvName


# ----------------------------------------------------------------------------- models
def _has_tokenizer(d: Path) -> bool:
    return (d / "tokenizer.json").is_file()


def _checkpoint_step(d: Path, run_dir: Path) -> int:
    """The step of a checkpoint folder: the last number in its path below the run dir
    (``checkpoints/step-000010``, ``ckpt_10/model`` -> 10); -1 if none."""
    rel = str(d.relative_to(run_dir))
    digits = "".join(ch if ch.isdigit() else " " for ch in rel).split()
    return int(digits[-1]) if digits else -1


def _is_model_dir(d: Path) -> bool:
    """A HF checkpoint (``config.json``) or a peft adapter folder (``adapter_config.json``)."""
    return (d / "config.json").is_file() or is_adapter_dir(d)


def adapter_base_dir(adapter_dir: Path, base: Optional[str]) -> Path:
    """The local folder of an adapter's base model: ``base`` (``--base``) when given, else what the
    adapter's ``adapter_config.json`` names (a folder or a Hugging Face model id). One-line
    :class:`EvalError` when neither names a model that can be had."""
    try:
        spec = base or adapter_base(adapter_dir)
    except ValueError as exc:  # a damaged adapter_config.json
        raise EvalError(f"model={str(adapter_dir)!r}: {exc}") from None
    if not spec:
        raise EvalError(
            f"model={str(adapter_dir)!r}: a LoRA adapter whose adapter_config.json names no base model; "
            f"give it with --base (the base model's folder or Hugging Face id)"
        )
    key = "--base" if base else f"{adapter_dir / ADAPTER_CONFIG}'s base_model_name_or_path"
    try:
        return resolve_model_path(spec, key)
    except ModelNotFound as exc:
        raise EvalError(f"{exc}{'' if base else '; give the base model with --base'}") from None


def resolve_model(path: str | os.PathLike[str], base: Optional[str] = None) -> tuple[Path, Path, Optional[Path]]:
    """(model dir, tokenizer dir, run dir or None) for a HF checkpoint, a LoRA adapter folder, a
    training run directory or a Hugging Face model id (its snapshot in the Hugging Face cache,
    fetched there when missing).

    A run directory (one holding ``config.yaml`` from ``python -m pcsd.train``) gives its
    ``final-model``, or else its newest checkpoint (a folder below it with ``config.json``, or a
    LoRA run's ``adapter_config.json``, and the highest step number in its name). The tokenizer
    comes from the model folder when it has one, else from the run's ``sft-model``, ``base-model``
    or configured ``model.path``, else (an adapter) from its base model (``base``: ``--base``).
    """
    p = Path(path)
    if not p.exists() and is_model_id(path):  # a Hugging Face model id: its snapshot (cache, or fetched)
        try:
            snap = resolve_model_path(path, "--model")
        except ModelNotFound as exc:
            raise EvalError(str(exc)) from None
        return snap, snap, None
    if not p.exists():
        raise EvalError(
            f"model={str(p)!r}: no such file or directory (expected a HF checkpoint, a LoRA adapter folder, "
            f"a run dir or a Hugging Face model id)"
        )
    run_dir: Optional[Path] = None
    if _is_model_dir(p):
        model_dir = p
        for up in (p.parent, p.parent.parent, p.parent.parent.parent):
            if (up / "config.yaml").is_file():
                run_dir = up
                break
    elif (p / "config.yaml").is_file():
        run_dir = p
        if (p / "final-model" / "config.json").is_file():
            model_dir = p / "final-model"
        else:
            skip = {"base-model", "sft-model", "final-adapter"}
            found = list(p.rglob("config.json")) + list(p.rglob(ADAPTER_CONFIG))
            cands = sorted({c.parent for c in found if c.parent.name not in skip})
            if not cands:
                warm = (
                    f" (its warm-up's model: --model {p / 'sft-model'})"
                    if (p / "sft-model" / "config.json").is_file()
                    else ""
                )
                raise EvalError(f"model={str(p)!r}: a run directory without final-model/ or any checkpoint{warm}")
            model_dir = max(cands, key=lambda d: (_checkpoint_step(d, p), d.stat().st_mtime))
    else:
        raise EvalError(
            f"model={str(p)!r}: neither a HF checkpoint (config.json), a LoRA adapter (adapter_config.json) "
            f"nor a run directory (config.yaml)"
        )
    from pcsd.models import check_model_dir

    adapter = is_adapter_dir(model_dir) and not (model_dir / "config.json").is_file()
    problem = None if adapter else check_model_dir(model_dir)
    if problem:
        raise EvalError(f"model={str(p)!r}: {problem}")
    tok_cands = [model_dir]
    if run_dir is not None:
        tok_cands += [run_dir / "sft-model", run_dir / "base-model"]
        mp = _saved_config(run_dir).get("model", {}).get("path")
        if mp:
            try:  # the run's base model: a folder, or a model id's cached snapshot
                tok_cands.append(resolve_model_path(mp, download=False))
            except ModelNotFound:
                tok_cands.append(Path(mp))
    tok = next((d for d in tok_cands if _has_tokenizer(d)), None)
    if tok is None and adapter:
        tok_cands.append(adapter_base_dir(model_dir, base))
        tok = tok_cands[-1] if _has_tokenizer(tok_cands[-1]) else None
    if tok is None:
        raise EvalError(f"model={str(p)!r}: no tokenizer.json in {', '.join(str(d) for d in tok_cands)}")
    return model_dir, tok, run_dir


def load_eval_model(model_dir: Path, base: Optional[str], device):
    """The model of ``model_dir`` for the hf backend: a HF checkpoint as it is, a LoRA adapter
    merged into its base model (:func:`pcsd.lora.load_merged`)."""
    from pcsd.models import load_model

    if (model_dir / "config.json").is_file() or not is_adapter_dir(model_dir):
        return load_model(model_dir, device).eval()
    base_model = load_model(adapter_base_dir(model_dir, base), device)
    try:
        return load_merged(model_dir, base_model).eval()
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def start_backend(name: str, model_dir: Path, base: Optional[str], device, **kw):
    """The evaluation's generation backend for ``model_dir``. vLLM serves a LoRA adapter as the
    trainer does: the engine starts from the base model and receives the merged weights once."""
    import torch

    from pcsd.lora import weight_sources
    from pcsd.models import eos_id
    from pcsd.rollout.backends import make_backend

    adapter = is_adapter_dir(model_dir) and not (model_dir / "config.json").is_file()
    if name == "hf":
        return make_backend("hf", model=load_eval_model(model_dir, base, device), pad_token_id=eos_id(kw["builder"]))
    dtype = "float32" if device.type == "cpu" else "bfloat16"
    path = adapter_base_dir(model_dir, base) if adapter else model_dir
    backend = make_backend("vllm", model_path=path, seed=kw["seed"], dtype=dtype, max_model_len=kw["max_model_len"])
    if adapter:
        merged = load_eval_model(model_dir, base, torch.device("cpu"))
        dt = torch.float32 if dtype == "float32" else torch.bfloat16
        backend.load_weights((n, src.make(dt)) for src in weight_sources(merged) for n in src.names)
        del merged
    return backend


def _run_label(run_dir: Optional[Path], model_dir: Path, skills: bool) -> str:
    label = model_dir.name
    if run_dir is not None:
        c = _saved_config(run_dir)
        algo, optim = c.get("algo", {}), c.get("optim", {})
        if optim.get("steps", 1) == 0:
            label = "Vanilla"
        elif algo.get("student_skills"):
            label = "Skill-GRPO"
        elif not algo.get("grpo", True):
            label = "OPSD"
        elif not algo.get("distill", True):
            label = "GRPO"
        else:
            label = RULE_LABELS.get(c.get("rule", ""), str(c.get("rule", label)))
    return label + ("*" if skills else "")


# ----------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pcsd.eval",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model",
        action="append",
        required=True,
        help="HF checkpoint folder, training run dir or Hugging Face model id (repeat for more rows)",
    )
    ap.add_argument(
        "--base",
        default=None,
        help="the base model of a LoRA adapter --model (a folder or Hugging Face id; default: the one its "
        "adapter_config.json names)",
    )
    ap.add_argument(
        "--label",
        action="append",
        default=None,
        help="row label per --model (default: the run's method, e.g. PCSD, GRPO)",
    )
    ap.add_argument(
        "--split",
        default=None,
        help=f"comma-separated, of {', '.join(registry.eval_splits())} (default: the first split of the env the "
        f"run trained on, else {registry.default().eval_splits[0]})",
    )
    ap.add_argument("--count", type=int, default=0, help="only the first N games (after --task-types)")
    ap.add_argument(
        "--protocol",
        default="full",
        choices=["full", "paper"],
        help="full: every game once (default); paper: 128 episodes drawn as verl-agent validates",
    )
    ap.add_argument(
        "--episodes", type=int, default=0, help="full: a stratified subset of N games; paper: N draws (default 128)"
    )
    ap.add_argument(
        "--validation-index",
        type=int,
        default=0,
        help="protocol paper: which validation of a training run (0 = before training)",
    )
    ap.add_argument(
        "--draw-seed",
        type=int,
        default=None,
        help="protocol paper: verl-agent's env.seed (default: the run's run.seed, else 0)",
    )
    ap.add_argument(
        "--enable-thinking",
        default=None,
        choices=["true", "false"],
        help="the chat template's enable_thinking (Qwen3); default: the run's model.enable_thinking",
    )
    ap.add_argument("--temperature", type=float, default=0.4)
    ap.add_argument("--greedy", action="store_true", help="temperature 0")
    ap.add_argument("--skills", action="store_true", help="skills in the student prompt (starred rows)")
    ap.add_argument(
        "--skills-dir",
        default=None,
        help="the skills folder for --skills (implies it; layout of env.skills_dir); default: a run's "
        "own copy (<run>/skills/, when it trained with env.skills_dir), else the built-in skills",
    )
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--batch-size", type=int, default=0, help="games played together (0 = all)")
    ap.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--max-steps", type=int, default=None, help="default: the run's env.max_steps, else the env's")
    ap.add_argument("--max-response-tokens", type=int, default=None, help="default: the run's, else 512")
    ap.add_argument("--max-prompt-tokens", type=int, default=None, help="default: the run's, else the env's")
    ap.add_argument("--history-length", type=int, default=None, help="default: the run's, else 2")
    ap.add_argument("--out", default=None, help="output folder (default <run>/eval or eval-<time>)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    seen: set[type] = set()
    for kind in registry.kinds():  # each kind's own options (once per kind class)
        if kind.eval_splits and type(kind) not in seen:
            seen.add(type(kind))
            kind.add_eval_arguments(ap)
    return ap


def _saved_config(run_dir: Path) -> DictConfig:
    """A run's saved ``config.yaml`` (a DictConfig; a file that is no mapping is an :class:`EvalError`)."""
    from omegaconf import DictConfig, OmegaConf

    cfg = OmegaConf.load(run_dir / "config.yaml")
    if not isinstance(cfg, DictConfig):
        raise EvalError(f"{run_dir / 'config.yaml'} is not a config (a YAML mapping of keys)")
    return cfg


def _run_config(run_dir: Optional[Path]) -> dict:
    """A run's saved config as a dict (``{}`` for a model that is not a run)."""
    if run_dir is None:
        return {}
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(_saved_config(run_dir))
    assert isinstance(out, dict)  # a DictConfig's container
    return out


def _run_kind(run_cfg: dict):
    """The env kind a run trained on (the default kind for a model that is not a run)."""
    name = (run_cfg.get("env") or {}).get("name")
    try:
        return registry.get(str(name)) if name else registry.default()
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def _skill_repositories(
    args: argparse.Namespace, run_dir: Optional[Path], run_cfg: dict, envs: Sequence[EnvName]
) -> dict:
    """The skills each prompt family's prompts read with ``--skills``: ``--skills-dir`` for every
    family, else the run's own copy (``<run>/skills/``, written by the trainer when it ran with
    ``env.skills_dir``) for the family it trained on, else None (the built-in skills)."""
    from pcsd.text.prompts import SkillRepository

    repos: dict = {env: None for env in envs}  # by prompt family
    if args.skills_dir is not None:
        for env in envs:
            try:
                repos[env] = SkillRepository(Path(args.skills_dir).expanduser(), env)
            except (OSError, ValueError) as exc:
                raise EvalError(f"skills_dir={args.skills_dir}: {exc}") from None
        return repos
    run_env = run_cfg.get("env", {}) or {}
    if not args.skills or run_dir is None or run_env.get("skills_dir") is None:
        return repos
    env = _run_kind(run_cfg).prompt
    if env not in repos:
        return repos
    own = run_dir / "skills"
    if not own.is_dir():
        raise EvalError(
            f"model={run_dir}: the run trained with env.skills_dir={run_env['skills_dir']} but holds no "
            f"copy of it (skills/); pass that folder as --skills-dir"
        )
    try:
        repos[env] = SkillRepository(own, env)
    except (OSError, ValueError) as exc:
        raise EvalError(f"model={run_dir}: {exc}") from None
    return repos


def _draw_seed(args: argparse.Namespace, run_cfg: dict) -> int:
    return args.draw_seed if args.draw_seed is not None else int(run_cfg.get("run", {}).get("seed", 0) or 0)


def _resolve_games(split: str, args: argparse.Namespace, out_dir: Path, run_cfg: dict) -> list:
    """The tasks ``--split split`` plays for a run of config ``run_cfg`` (its kind's evaluation plan)."""
    from pcsd.envs.kind import TaskError

    if args.draw_seed is None:
        args.draw_seed = _draw_seed(args, run_cfg)
    try:
        return registry.for_split(split).eval_plan(split, args, None, run_cfg, out_dir).tasks
    except (TaskError, ValueError) as exc:
        raise EvalError(str(exc)) from None


def _default_split(args: argparse.Namespace) -> str:
    """The first split of the env the first ``--model`` trained on (``--env``: the Python env's)."""
    if getattr(args, "env", None):
        return registry.for_split("env").eval_splits[0]
    return _run_kind(_run_config(resolve_model(args.model[0], args.base)[2])).eval_splits[0]


def run_cli(args: argparse.Namespace) -> tuple[str, dict]:
    """Evaluates every ``--model`` on every split; returns (markdown, JSON document). The output
    folder is made once the arguments and models check out, and removed again (with the parents
    made for it) when the evaluation is refused or fails after that."""
    if args.split is None:  # a run evaluates on the env it trained on
        args.split = _default_split(args)
    splits = [s.strip() for s in args.split.split(",") if s.strip()]
    try:
        kinds = {s: registry.for_split(s) for s in splits}  # split -> the env kind that plays it
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    seen: set[type] = set()
    for kind in registry.kinds():
        if kind.eval_splits and type(kind) not in seen:
            seen.add(type(kind))
            kind.check_eval_arguments(splits, args)
    if args.label is not None and len(args.label) != len(args.model):
        raise EvalError(f"label: give one --label per --model ({len(args.model)}), got {len(args.label)}")
    for name in ("count", "batch_size", "episodes", "validation_index"):
        if getattr(args, name) < 0:
            raise EvalError(f"{name}={getattr(args, name)}: expected >= 0")
    for name in ("max_steps", "max_response_tokens", "max_prompt_tokens"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise EvalError(f"{name}={v}: expected > 0")
    if args.temperature < 0:
        raise EvalError(f"temperature={args.temperature}: expected >= 0")
    envs = sorted({k.prompt for k in kinds.values()})  # the prompt families the splits need
    if args.skills_dir is not None:  # checked before any model loads
        args.skills = True
        _skill_repositories(args, None, {}, envs)
    models = [resolve_model(m, args.base) for m in args.model]
    out_dir = (
        Path(args.out)
        if args.out
        else (
            models[0][2] / "eval"
            if len(models) == 1 and models[0][2] is not None
            else Path("eval-results") / time.strftime("%Y%m%d-%H%M%S")
        )
    )
    made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]  # what this evaluation creates
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _evaluate(args, splits, kinds, envs, models, out_dir)
    except BaseException:  # a refused or failed evaluation leaves no folder of its own behind
        if made:
            shutil.rmtree(made[0], ignore_errors=True)  # the folder written into (games/ of procedural)
            for d in made[1:]:
                with contextlib.suppress(OSError):
                    d.rmdir()  # the parents created for it, where they stayed empty
        raise


def _evaluate(
    args: argparse.Namespace, splits: list[str], kinds: dict, envs: Sequence[EnvName], models: list, out_dir: Path
) -> tuple[str, dict]:
    """The evaluation of :func:`run_cli` once its arguments are checked and ``out_dir`` exists."""
    import torch

    from pcsd.envs.kind import TaskError
    from pcsd.models import eos_id, resolve_device
    from pcsd.progress import ProgressReporter
    from pcsd.rollout.backends import usable_backend
    from pcsd.text.prompts import DEFAULT_MAX_PRIVILEGED_TOKENS, PromptBuilder

    first_run = _run_config(models[0][2])
    args.draw_seed = _draw_seed(args, first_run)
    try:
        plans = {s: kinds[s].eval_plan(s, args, models[0][2], first_run, out_dir) for s in splits}
    except TaskError as exc:
        raise EvalError(str(exc)) from None
    templates = {k.prompt: plans[s].template for s, k in kinds.items() if plans[s].template is not None}
    temp = 0.0 if args.greedy else args.temperature
    device = resolve_device(args.device)
    results: list[EvalResult] = []
    reporter = ProgressReporter(enabled=False if args.quiet else None)
    with reporter:
        for k, (model_dir, tok_dir, run_dir) in enumerate(models):
            rc = _run_config(run_dir)
            env_c, roll_c = rc.get("env", {}), rc.get("rollout", {})
            run_family = _run_kind(rc).prompt

            def limits(split: str) -> tuple[int, int, int]:
                # the flag, else the run's (when it trained on this prompt family), else the env's default
                plan, mine = plans[split], run_family == kinds[split].prompt
                return (
                    args.max_steps or (mine and env_c.get("max_steps")) or plan.max_steps,
                    args.max_response_tokens
                    or (mine and roll_c.get("max_response_tokens"))
                    or plan.max_response_tokens,
                    args.max_prompt_tokens or (mine and roll_c.get("max_prompt_tokens")) or plan.max_prompt_tokens,
                )

            max_len = max(p + r for _, r, p in map(limits, splits))
            hist = env_c.get("history_length", 2) if args.history_length is None else args.history_length
            thinking = (
                {"true": True, "false": False}[args.enable_thinking]
                if args.enable_thinking
                else rc.get("model", {}).get("enable_thinking")
            )
            repos = _skill_repositories(args, run_dir, rc, envs)
            for s, kind in kinds.items():
                if args.skills and not kind.builtin_skills and repos[kind.prompt] is None:
                    raise EvalError(
                        f"skills: env.name={plans[s].pools.kind.name} has no built-in skills; evaluate a run that "
                        "trained with env.skills_dir (its copy is used) or pass --skills-dir"
                    )
            builders = {}
            for s, kind in kinds.items():  # one builder per prompt family (its budget: the split's)
                if kind.prompt in builders:
                    continue
                builders[kind.prompt] = PromptBuilder(
                    kind.prompt,
                    history_length=hist,
                    max_prompt_tokens=limits(s)[2],
                    tokenizer_dir=tok_dir,
                    enable_thinking=thinking,
                    skills=repos[kind.prompt],
                    template=templates.get(kind.prompt),
                    max_privileged_tokens=roll_c.get("max_privileged_tokens", DEFAULT_MAX_PRIVILEGED_TOKENS),
                )
                least = builders[kind.prompt].min_prompt_tokens()  # a budget no prompt of the template fits in
                if least is not None and limits(s)[2] < least:
                    raise EvalError(
                        f"max_prompt_tokens={limits(s)[2]} ({kind.prompt}) cannot hold a single prompt: the "
                        f"template alone is {least} tokens with this tokenizer; give --max-prompt-tokens"
                    )
            builder = next(iter(builders.values()))
            backend_name = usable_backend(args.backend, reporter.print)
            backend = start_backend(
                backend_name, model_dir, args.base, device, builder=builder, seed=args.seed, max_model_len=max_len
            )
            label = args.label[k] if args.label else _run_label(run_dir, model_dir, args.skills)
            try:
                for s in splits:
                    plan, family = plans[s], kinds[s].prompt
                    max_steps, max_resp, max_prompt = limits(s)
                    t0 = time.perf_counter()
                    res = play_games(
                        backend,
                        builders[family],
                        plan.tasks,
                        max_steps=max_steps,
                        max_response_tokens=max_resp,
                        temperature=temp,
                        seed=args.seed,
                        skills=args.skills,
                        batch_size=args.batch_size,
                        stop_token_ids=[eos_id(builder)],
                        progress=reporter.rollout(f"eval {label} {s}"),
                        pools=plan.pools,
                    )
                    settings = dict(
                        model=str(model_dir),
                        backend=backend_name,
                        temperature=temp,
                        seed=args.seed,
                        skills=args.skills,
                        batch_size=args.batch_size,
                        max_steps=max_steps,
                        skills_dir=None if repos[family] is None else str(repos[family].folder),
                        max_response_tokens=max_resp,
                        max_prompt_tokens=max_prompt,
                        history_length=hist,
                        enable_thinking=thinking,
                        protocol=args.protocol,
                        validation_index=args.validation_index,
                        draw_seed=args.draw_seed,
                        seconds=time.perf_counter() - t0,
                    )
                    results.append(
                        EvalResult(
                            label=label, split=plan.split, games=res, settings=settings, env=plan.pools.kind.name
                        )
                    )
            finally:
                backend.close()
                del backend
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    table = render_table(results)
    doc = dict(table=table, results=[r.to_dict() for r in results])
    (out_dir / "table.md").write_text(table)
    (out_dir / "results.json").write_text(json.dumps(doc, indent=2))
    doc["out_dir"] = str(out_dir)
    return table, doc


def main(argv: Optional[list[str]] = None) -> int:
    from pcsd.envs.kind import EnvFailure
    from pcsd.models import ModelLoadError

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        table, doc = run_cli(args)
    except (EvalError, FileNotFoundError, ModelLoadError, EnvFailure) as exc:
        print(f"pcsd.eval: error: {exc}", file=sys.stderr)
        return 2
    print(table, end="")
    print(f"[pcsd] wrote {doc['out_dir']}/table.md and results.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
