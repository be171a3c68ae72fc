"""``python -m pcsd.data`` / ``pcsd-data``: the real data and models, with one command each.

    pcsd-data alfworld [--dest DIR] [--from DIR]            # ALFWorld's games (3,553 / 140 / 134)
    pcsd-data webshop [--full] [--dest DIR] [--from DIR]    # WebShop's 1,000 products (--full: 1.18 M)
    pcsd-data model Qwen/Qwen2.5-3B-Instruct [--dest DIR]   # a Hugging Face model (cache, or a folder)

Each downloads from the original public source (``PCSD_ALFWORLD_URL`` / ``PCSD_WEBSHOP_URL`` name a
mirror, ``HF_ENDPOINT`` a Hub mirror), shows a progress bar, resumes a partial download, checks
what arrived before moving it into place, and ends by printing the variable or key to set.
``--from DIR`` installs from a local copy instead (air-gapped machines). A failure is one line
naming what was tried; the exit status is 1.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from rich.console import Console

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pcsd-data",
        description="Fetch the real games, the WebShop catalogue and models, checked, into local folders.",
    )
    sub = p.add_subparsers(dest="source", required=True, metavar="{alfworld,webshop,model}")

    def common(sp: argparse.ArgumentParser, dest_help: str) -> None:
        sp.add_argument("--dest", help=dest_help)
        sp.add_argument(
            "--from",
            dest="from_dir",
            metavar="DIR",
            help="install from a local copy of the files instead of downloading (air-gapped machines)",
        )
        sp.add_argument("--force", action="store_true", help="replace an existing install")

    a = sub.add_parser("alfworld", help="ALFWorld's text games: train / valid_seen / valid_unseen")
    common(a, "the folder ALFWORLD_DATA will name (default: $ALFWORLD_DATA, else ~/.cache/alfworld)")
    a.add_argument("--manifest", help="a manifest of your own (other URLs, counts, checksums)")

    w = sub.add_parser("webshop", help="WebShop's product catalogue and the reward's noun table")
    common(
        w,
        "the folder WEBSHOP_DATA will name (default: $WEBSHOP_DATA, else ~/.cache/pcsd/webshop; "
        "--full: ~/.cache/pcsd/webshop-full)",
    )
    w.add_argument(
        "--full",
        action="store_true",
        help="the full 1.18 M-product catalogue (several GB to download, hours of spaCy for the nouns)",
    )
    w.add_argument("--nouns", metavar="FILE", help="a noun table you have, instead of building it with spaCy")
    w.add_argument("--manifest", help="a manifest of your own (other URLs, counts, checksums)")

    m = sub.add_parser("model", help="a Hugging Face model id into a local folder")
    m.add_argument("name", help="the model id, e.g. Qwen/Qwen2.5-3B-Instruct")
    common(
        m,
        "a model folder (default: the Hugging Face cache, where model.path=NAME finds it; with --from: "
        "~/.cache/pcsd/models/<name>)",
    )
    m.add_argument("--revision", help="a branch, tag or commit of the model (default: main)")
    return p


def run(args: argparse.Namespace, console: Console) -> str:
    """Installs what ``args`` asks for; returns the line that says what to set (shell-quoted: a path
    with spaces pastes as one word)."""
    if args.source == "alfworld":
        from pcsd.data import alfworld
        from pcsd.data.fetch import load_manifest

        dest = alfworld.install(
            load_manifest("alfworld", args.manifest),
            Path(args.dest) if args.dest else alfworld.default_dest(),
            from_dir=args.from_dir,
            force=args.force,
            console=console,
        )
        return f"export ALFWORLD_DATA={shlex.quote(str(dest))}"
    if args.source == "webshop":
        from pcsd.data import webshop
        from pcsd.data.fetch import load_manifest

        dest = webshop.install(
            load_manifest("webshop", args.manifest),
            Path(args.dest) if args.dest else webshop.default_dest(args.full),
            full=args.full,
            from_dir=args.from_dir,
            nouns=args.nouns,
            force=args.force,
            console=console,
        )
        return f"export WEBSHOP_DATA={shlex.quote(str(dest))}"
    from pcsd.data import model

    where = model.install(
        args.name,
        Path(args.dest) if args.dest else None,
        revision=args.revision,
        from_dir=args.from_dir,
        force=args.force,
        console=console,
    )
    return f"model.path={shlex.quote(str(where))}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    from pcsd.data.fetch import DataError

    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        line = run(args, console)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; run the same command again to resume the download", file=sys.stderr)
        return 130
    console.print("set:", style="bold")
    print(line, flush=True)
    return 0


def console_main() -> None:
    """Entry point of the ``pcsd-data`` script."""
    sys.exit(main())
