"""The body of one worker process of :mod:`pcsd.envs.pypool` (imported alone in the worker, so
it stays light: the standard library and :mod:`pcsd.envs.protocol`).

A worker receives the pickled env factory, then lists of requests, and answers each list with one
list of results. Requests: ``("reset", slot, seed, options)``, ``("step", slot, action)``,
``("replay", slot, seed, options, actions, expected_observation)`` (rebuild an episode on a new
worker), ``("expert", slot)``, ``("has_expert", slot)``; results: ``("ok", value)`` or
``("error", message, stage)``. Before each request the worker counts it in shared memory
(:data:`MARK`: requests started, requests finished), from which the parent tells which request a
hung or dead worker was in.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import struct
import sys
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional

from pcsd.envs.protocol import EnvBuildError, ProtocolError, check_reset, check_step

__all__ = ["MARK", "first_line", "main"]

#: per worker, in shared memory: requests started, requests finished
MARK = struct.Struct("qq")


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _plain(s: str) -> str:
    return s if type(s) is str else str.__str__(s)


class _WorkerState:
    """What one worker process holds: its envs (by local slot) and the factory that builds them."""

    def __init__(self, factory: Any, factory_error: Optional[str]) -> None:
        self.factory = factory
        self.factory_error = factory_error
        self.envs: list[Any] = []

    def env(self, slot: int) -> Any:
        while len(self.envs) <= slot:
            self.envs.append(None)
        if self.envs[slot] is None:
            if self.factory_error is not None:
                raise EnvBuildError("import", self.factory_error)
            try:
                self.envs[slot] = self.factory()
            except EnvBuildError:
                raise
            except Exception as exc:  # a factory of the caller's own (EnvFactory names its stage itself)
                raise EnvBuildError("construct", f"the env factory raised {first_line(exc)}") from None
        return self.envs[slot]

    def reset(self, slot: int, seed: Optional[int], options: Optional[dict]) -> tuple:
        env = self.env(slot)
        try:
            res = env.reset(seed=seed, options=options)
        except Exception as exc:
            raise _EnvRaised(f"reset() raised {first_line(exc)}") from None
        return check_reset(res)

    def built(self, slot: int) -> Any:
        env = self.envs[slot] if slot < len(self.envs) else None
        if env is None:
            raise _EnvRaised("the env was never built here (reset it first)")
        return env

    def step(self, slot: int, action: str) -> tuple:
        env = self.built(slot)
        try:
            res = env.step(action)
        except Exception as exc:
            raise _EnvRaised(f"step() raised {first_line(exc)}") from None
        return check_step(res)

    def run(self, op: tuple) -> tuple:
        """One request -> ``("ok", value)`` or ``("error", message, stage)`` (stage: ``import`` or
        ``construct`` when the env could not be built, else ``env``)."""
        kind = op[0]
        try:
            if kind == "reset":
                return ("ok", self.reset(op[1], op[2], op[3]))
            if kind == "step":
                return ("ok", self.step(op[1], op[2]))
            if kind == "replay":  # rebuild an episode: reset, the actions, then the observation it had reached
                _, slot, seed, options, actions, expected = op
                out = self.reset(slot, seed, options)
                for a in actions:
                    out = self.step(slot, a)
                if out[0] != expected:
                    return (
                        "error",
                        "lost with its worker process: replaying its episode gave a different "
                        "observation (the env is not deterministic for a seed)",
                        "env",
                    )
                return ("ok", None)
            if kind == "expert":
                fn = _expert_of(self.built(op[1]))
                if fn is None:
                    return ("error", f"{type(self.envs[op[1]]).__name__} has no expert_action()", "env")
                try:
                    a = fn()
                except Exception as exc:
                    return ("error", f"expert_action() raised {first_line(exc)}", "env")
                if a is not None and not isinstance(a, str):
                    return ("error", f"expert_action() returned {type(a).__name__}, expected str or None", "env")
                return ("ok", a if a is None else _plain(a))
            if kind == "has_expert":
                return ("ok", _expert_of(self.env(op[1])) is not None)
            return ("error", f"unknown request {kind!r}", "env")
        except EnvBuildError as exc:
            return ("error", f"building the env: {exc}", exc.stage)
        except (ProtocolError, _EnvRaised) as exc:
            return ("error", str(exc), "env")
        except Exception as exc:  # never let a request end the worker
            return ("error", f"{kind} failed: {first_line(exc)}", "env")

    def close(self) -> None:
        for env in self.envs:
            close = getattr(env, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    pass
        self.envs = []


def _expert_of(env: Any) -> Optional[Callable[[], Any]]:
    """The env's ``expert_action`` (also under Gymnasium's wrappers, on ``env.unwrapped``)."""
    for obj in (env, getattr(env, "unwrapped", None)):
        fn = getattr(obj, "expert_action", None)
        if callable(fn):
            return fn
    return None


class _EnvRaised(Exception):
    """An env's own method raised (the message says which and what)."""


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (a hung env cannot outlive the run)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass


def main(sock_fd: int, mark_fd: int, index: int) -> None:
    """Body of one worker process: receives lists of requests, answers each list with one list of
    results; before every request it counts it in shared memory (the parent reads which request a
    hung or dead worker was in)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    if os.getcwd() not in sys.path:  # envs are importable from the current folder (after the installed packages)
        sys.path.append(os.getcwd())
    conn = Connection(sock_fd)
    mm = mmap.mmap(mark_fd, 0)
    off = index * MARK.size
    started = finished = 0  # the parent zeroed this worker's counters before starting it
    try:
        factory, error = None, None
        try:
            factory = pickle.loads(conn.recv_bytes())
        except Exception as exc:
            error = f"the env factory could not be unpickled in the worker: {first_line(exc)}"
        state = _WorkerState(factory, error)
        conn.send_bytes(pickle.dumps(("ready", os.getpid())))
        while True:
            ops = pickle.loads(conn.recv_bytes())
            if ops is None:
                break
            out = []
            for op in ops:
                started += 1
                MARK.pack_into(mm, off, started, finished)
                out.append(state.run(op))
                finished += 1
            MARK.pack_into(mm, off, started, finished)
            conn.send_bytes(pickle.dumps(out, pickle.HIGHEST_PROTOCOL))
        state.close()
    except (EOFError, OSError):  # the parent went away
        pass
