"""``python -m pcsd.diagnostics {rank-robustness,quality-alignment} [options]``.

    python -m pcsd.diagnostics rank-robustness --synthetic
    python -m pcsd.diagnostics rank-robustness --run-dir runs/my-run     # its recorded gaps
    python -m pcsd.diagnostics quality-alignment --run-dir runs/my-run   # its sft-model/ (or base-model/)
    python -m pcsd.diagnostics quality-alignment --model /models/Qwen2.5-3B-Instruct --device cuda

``rank-robustness`` takes gap sequences from ``--synthetic`` (see
:func:`pcsd.diagnostics.robustness.synthetic_gaps`), from a run directory's recorded gaps
(``run.record_gaps=true``), or, when the run recorded none or ``--model`` is given, from the model:
``--gaps-from rollouts`` (default) plays fresh rollouts and scores them with and without the
skills as a training step does, ``--gaps-from expert`` scores the expert's trajectories. ``quality-alignment`` needs a model:
``--model DIR`` or a run directory (its ``sft-model/``, else ``base-model/``, else
``final-model/``). Both print a rich table and write ``diagnostics.json`` (each subcommand its
own section) and PNG figures to ``--out`` (default ``<run dir>/diagnostics`` or
``runs/diagnostics``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

__all__ = ["main", "build_parser"]

#: seed of the procedural games the expert plays for the diagnostics (apart from training and
#: evaluation games: pcsd.train.job uses 1000, 900000 and 500000)
DIAG_GAMES_SEED = 700_000


def build_parser() -> argparse.ArgumentParser:
    from pcsd.diagnostics.robustness import FRACTIONS

    p = argparse.ArgumentParser(
        prog="python -m pcsd.diagnostics",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp):
        sp.add_argument("--run-dir", help="a pcsd run directory (recorded gaps, config, models)")
        sp.add_argument("--model", help="a model directory (HF checkpoint with tokenizer) or a Hugging Face model id")
        sp.add_argument("--out", help="output directory (default <run dir>/diagnostics or runs/diagnostics)")
        sp.add_argument("--rules", help="comma-separated weighting rules (default: every registered rule)")
        sp.add_argument("--figure-rules", default="pcsd,sdar", help="rules drawn in the paper-layout figure")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
        sp.add_argument("--games", type=int, default=24, help="procedural games the expert plays (model scoring)")
        sp.add_argument("--episodes", help="recorded episodes (JSON/JSONL) instead of the native expert's")
        sp.add_argument(
            "--expert",
            default="observation",
            choices=("observation", "skills"),
            help="the native expert: observation-only (default), or the one that searches first "
            "where the teacher's skills point (optim.sft_teacher_demos=skills)",
        )
        sp.add_argument("--max-pairs", type=int, default=0, help="at most this many state-action pairs (0: all)")
        sp.add_argument("--quiet", action="store_true", help="no table on stdout")

    rr = sub.add_parser("rank-robustness", help="Spearman of weights before/after isolated gap spikes")
    common(rr)
    rr.add_argument("--synthetic", action="store_true", help="synthetic gap sequences")
    rr.add_argument("--segments", type=int, default=256, help="synthetic: response turns")
    rr.add_argument("--fractions", default=",".join(f"{f:g}" for f in FRACTIONS))
    rr.add_argument("--repeats", type=int, default=10, help="seeded spike draws per fraction")
    rr.add_argument("--magnitude", type=float, default=3.0)
    rr.add_argument("--sign", default="both", choices=("both", "positive", "negative"))
    rr.add_argument("--max-tokens", type=int, default=200_000, help="recorded gaps: at most this many tokens")
    rr.add_argument(
        "--gaps-from",
        default="rollouts",
        choices=("rollouts", "expert"),
        help="with a model: score fresh rollouts of the model (as in training) or expert trajectories",
    )
    rr.add_argument("--group-size", type=int, default=2, help="fresh rollouts per game")
    rr.add_argument(
        "--max-steps", type=int, default=0, help="fresh rollouts: turns per episode (0: the run's env.max_steps)"
    )
    rr.add_argument(
        "--max-response-tokens",
        type=int,
        default=0,
        help="fresh rollouts: tokens per turn (0: the run's rollout.max_response_tokens)",
    )

    qa = sub.add_parser("quality-alignment", help="dQ vs dW under skill removal / shuffled skills")
    common(qa)
    return p


def _model_dir(args) -> Path:
    if args.model:  # a folder, or a Hugging Face model id's snapshot
        from pcsd.models import ModelNotFound, resolve_model_path

        try:
            return resolve_model_path(args.model, "--model")
        except ModelNotFound as exc:
            raise SystemExit(f"error: {exc}") from None
    if not args.run_dir:
        raise SystemExit("error: give --model DIR or --run-dir DIR (or --synthetic for rank-robustness)")
    run = Path(args.run_dir)
    for name in ("sft-model", "base-model", "final-model"):
        if (run / name / "config.json").is_file():
            return run / name
    raise SystemExit(f"error: {run} has no sft-model/, base-model/ or final-model/ with a config.json")


def _run_config(args):
    """The run's saved config, or the tiny-cpu preset's."""
    from omegaconf import OmegaConf

    from pcsd.train.config import load_config

    if args.run_dir and (Path(args.run_dir) / "config.yaml").is_file():
        return load_config(base=OmegaConf.load(Path(args.run_dir) / "config.yaml"))
    return load_config([])


def _skills(args, cfg):
    """The teacher's skills: a run's own copy (``<run>/skills/``), else its ``env.skills_dir``,
    else None (the built-in skills)."""
    from pcsd.text.prompts import SkillRepository
    from pcsd.train.job import skill_repository

    if args.run_dir and cfg.env.get("skills_dir") is not None and (Path(args.run_dir) / "skills").is_dir():
        from pcsd.envs import registry

        # the prompt family's layout (a Python env's kinds share "text")
        return SkillRepository(Path(args.run_dir) / "skills", registry.get(str(cfg.env.name)).prompt)
    return skill_repository(cfg)


def _scored(args, console):
    """Expert pairs scored by the model in every context (see pcsd.diagnostics.alignment)."""
    import torch

    from pcsd.diagnostics.alignment import expert_pairs, load_episodes, score_contexts
    from pcsd.models import eos_id, load_model, resolve_device
    from pcsd.text.prompts import PromptBuilder

    cfg = _run_config(args)
    model_dir = _model_dir(args)
    skills = _skills(args, cfg)
    t0 = time.time()
    from pcsd.envs import registry

    kind = registry.get(str(cfg.env.name))
    text_env = kind.prompt == "text"
    if args.episodes:
        episodes = load_episodes(args.episodes)
        src = args.episodes
    elif text_env:  # a Python env: its own expert, told that the teacher's context is in the prompt
        episodes, src = _env_expert_episodes(cfg, args.games)
    else:
        from pcsd.diagnostics.report import out_dir_for
        from pcsd.envs.kinds.alfworld import procedural_knobs
        from pcsd.envs.procedural import write_games
        from pcsd.train.sft import expert_episodes

        base = Path(args.run_dir) if args.run_dir else out_dir_for(args.out, None)
        games = write_games(base / "games" / "diagnostics", args.games, DIAG_GAMES_SEED, **procedural_knobs(cfg))
        if args.expert == "skills":
            from pcsd.train.sft import skill_search_first

            episodes = expert_episodes(games, cfg.env.max_steps, cfg.optim.sft_navigation, skill_search_first(skills))
            src = f"{len(games)} procedural games played by the expert that follows the skills"
        else:
            episodes = expert_episodes(games, cfg.env.max_steps, cfg.optim.sft_navigation)
            src = f"{len(games)} procedural games played by the observation-only expert"
    pairs = expert_pairs(episodes, args.max_pairs)
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    model = load_model(model_dir, device, "float32" if device.type == "cpu" else "auto").eval()
    builder = PromptBuilder(
        kind.prompt if text_env else "alfworld",
        history_length=cfg.env.history_length,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        tokenizer_dir=model_dir,
        skills=skills,
        template=kind.template(cfg, Path(args.run_dir) if args.run_dir else None) if text_env else None,
    )
    sc = score_contexts(
        model, builder, pairs, eos_id(builder), seed=args.seed, tokens_per_pass=cfg.optim.tokens_per_microbatch
    )
    console.print(
        f"[pcsd.diagnostics] scored {len(pairs)} expert state-action pairs ({src}) with {model_dir} "
        f"in 4 contexts, {time.time() - t0:.1f}s"
    )
    return sc, dict(model=str(model_dir), episodes_source=src, num_episodes=len(episodes))


def _env_expert_episodes(cfg, games: int) -> tuple[list, str]:
    """A Python env's expert episodes on ``games`` seeds apart from training's and evaluation's: its
    ``expert_action(privileged=True)`` when it takes the keyword (the expert that reads the teacher's
    context, docs/environments.md), else ``expert_action()``."""
    from pcsd.envs.kinds.text import env_check, factories
    from pcsd.envs.pypool import PythonEnvPool, play_experts

    factory = factories(cfg)[0]
    check = env_check(factory, float(cfg.env.step_timeout))
    if not check.has_expert:
        raise SystemExit(f"error: {factory.describe()} has no expert_action() to play the diagnostics' episodes")
    flag = True if check.expert_takes_privileged else None
    seeds = [DIAG_GAMES_SEED + k for k in range(games)]
    with PythonEnvPool(factory, games, seeds=seeds, max_steps=cfg.env.max_steps) as pool:
        episodes = play_experts(pool, flag)
    who = "expert_action(privileged=True)" if flag else "expert_action()"
    return episodes, f"{games} episodes of {factory.describe()} played by its {who}"


def _rollout_gaps(args, console):
    """Gaps of fresh rollouts: the model plays ``--games`` procedural games ``--group-size`` times
    (the run's rollout settings, the hf backend), then scores its sampled responses with the student
    prompt and with the teacher prompt (skills), as one training step does."""
    import torch

    from pcsd.diagnostics.robustness import GapSet
    from pcsd.envs.kinds.alfworld import procedural_knobs
    from pcsd.envs.procedural import write_games
    from pcsd.models import eos_id, load_model, resolve_device
    from pcsd.ops.scoring import score_packed
    from pcsd.rollout.backends import make_backend
    from pcsd.rollout.loop import collect_rollouts
    from pcsd.text.prompts import PromptBuilder

    cfg = _run_config(args)
    model_dir = _model_dir(args)
    t0 = time.time()
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    model = load_model(model_dir, device, "float32" if device.type == "cpu" else "auto").eval()
    builder = PromptBuilder(
        "alfworld",
        history_length=cfg.env.history_length,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        tokenizer_dir=model_dir,
        skills=_skills(args, cfg),
    )
    from pcsd.diagnostics.report import out_dir_for

    base = Path(args.run_dir) if args.run_dir else out_dir_for(args.out, None)
    games = write_games(base / "games" / "diagnostics", args.games, DIAG_GAMES_SEED, **procedural_knobs(cfg))
    eos = eos_id(builder)
    backend = make_backend("hf", model=model, pad_token_id=eos)
    try:
        rb = collect_rollouts(
            backend,
            builder,
            games,
            args.group_size,
            max_steps=args.max_steps or cfg.env.max_steps,
            max_response_tokens=args.max_response_tokens or cfg.rollout.max_response_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            seed=args.seed,
            stop_token_ids=[eos],
            num_threads=cfg.env.num_threads,
        )
    finally:
        backend.close()
    rows = [i for i, r in enumerate(rb.response_ids) if r]
    prompts = [rb.prompt_ids[i] for i in rows]
    teacher = [rb.teacher_prompt_ids[i] for i in rows]
    resp = [rb.response_ids[i] for i in rows]
    with torch.no_grad():
        s = torch.cat(score_packed(model, prompts, resp, max_tokens_per_pass=cfg.optim.tokens_per_microbatch))
        t = torch.cat(score_packed(model, teacher, resp, max_tokens_per_pass=cfg.optim.tokens_per_microbatch))
    gap = (t - s).float().cpu().numpy()
    cu = [0]
    for r in resp:
        cu.append(cu[-1] + len(r))
    console.print(
        f"[pcsd.diagnostics] {rb.num_trajectories} fresh rollouts of {model_dir} on {len(games)} games "
        f"({len(resp)} turns, {len(gap)} tokens, success {100 * float(rb.won.float().mean()):.1f}%), "
        f"{time.time() - t0:.1f}s"
    )
    gs = GapSet(gap, [True] * len(gap), cu, source=f"fresh rollouts of {model_dir.name}")
    return gs, dict(
        model=str(model_dir), rollouts=rb.num_trajectories, rollout_success=100 * float(rb.won.float().mean())
    )


def _rules(args) -> Optional[list[str]]:
    from pcsd.ops.weighting import available_rules

    if not args.rules:
        return None
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    bad = [r for r in rules if r not in available_rules()]
    if bad:
        raise SystemExit(f"error: unknown rule(s) {bad}; valid: {', '.join(available_rules())}")
    return rules


def run_rank_robustness(args, console) -> dict:
    from pcsd.diagnostics import report
    from pcsd.diagnostics.robustness import gapset_from_records, rank_robustness, synthetic_gaps

    meta: dict = {}
    if args.synthetic:
        gs = synthetic_gaps(num_segments=args.segments, seed=args.seed)
    elif args.run_dir and not args.model and (Path(args.run_dir) / "gaps").is_dir():
        from pcsd.train.gaps import load_gap_records

        gs = gapset_from_records(load_gap_records(args.run_dir), max_tokens=args.max_tokens)
    else:
        if args.run_dir and not args.model:
            console.print(
                f"[pcsd.diagnostics] {args.run_dir} has no recorded gaps (run.record_gaps=true): "
                f"scoring {'fresh rollouts' if args.gaps_from == 'rollouts' else 'expert trajectories'} "
                f"with its model instead"
            )
        if args.gaps_from == "rollouts":
            gs, meta = _rollout_gaps(args, console)
        else:
            from pcsd.diagnostics.alignment import teacher_gapset

            sc, meta = _scored(args, console)
            gs = teacher_gapset(sc)
    try:
        fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    except ValueError:
        raise SystemExit(f"error: --fractions={args.fractions!r}: expected comma-separated numbers in [0, 1]") from None
    if not fractions or any(not 0 <= f <= 1 for f in fractions):
        raise SystemExit(f"error: --fractions={args.fractions!r}: expected comma-separated numbers in [0, 1]")
    if args.repeats < 1:
        raise SystemExit(f"error: --repeats={args.repeats}: expected at least 1")
    t0 = time.time()
    res = rank_robustness(
        gs, _rules(args), fractions, repeats=args.repeats, magnitude=args.magnitude, seed=args.seed, sign=args.sign
    )
    res.update(meta, seconds=time.time() - t0)
    out = report.out_dir_for(args.out, args.run_dir)
    if not args.quiet:
        console.print(report.robustness_table(res))
    figs = [
        report.plot_rank_robustness(res, out / "rank_robustness.png", args.figure_rules.split(",")),
        report.plot_rank_robustness(res, out / "rank_robustness_all_rules.png", list(res["rules"]), paper=False),
    ]
    res["figures"] = [str(f) for f in figs]
    path = report.write_json(out / "diagnostics.json", {"rank_robustness": res})
    console.print(f"[pcsd.diagnostics] wrote {path} and {', '.join(res['figures'])}")
    return res


def run_quality_alignment(args, console) -> dict:
    from pcsd.diagnostics import report
    from pcsd.diagnostics.alignment import quality_alignment

    sc, meta = _scored(args, console)
    res = quality_alignment(sc, _rules(args))
    res.update(meta)
    out = report.out_dir_for(args.out, args.run_dir)
    if not args.quiet:
        console.print(report.alignment_table(res))
    figs = [report.plot_quality_alignment(res, out / "quality_alignment.png", args.figure_rules.split(","))]
    res["figures"] = [str(f) for f in figs]
    path = report.write_json(out / "diagnostics.json", {"quality_alignment": res})
    console.print(f"[pcsd.diagnostics] wrote {path} and {', '.join(res['figures'])}")
    return res


def main(argv: Optional[list[str]] = None) -> int:
    from rich.console import Console

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    console = Console(markup=False, soft_wrap=True)
    if not console.is_terminal:  # files and pipes: wide enough that the tables do not wrap
        console = Console(markup=False, soft_wrap=True, width=170)
    if args.command == "rank-robustness":
        run_rank_robustness(args, console)
    else:
        run_quality_alignment(args, console)
    return 0
