"""The body of one worker process of :mod:`pcsd.envs.pypool` (imported alone in the worker, so
it stays light: the standard library and :mod:`pcsd.envs.protocol`).

A worker receives the pickled env factory, then lists of requests, and answers each list with one
list of results. Requests: ``("reset", slot, seed, options)``, ``("step", slot, action)``,
``("replay", slot, seed, options, actions, expected_observation)`` (rebuild an episode on a new
worker), ``("expert", slot[, privileged])``, ``("has_expert", slot)``,
``("expert_takes_privileged", slot)``; results: ``("ok", value)`` or
``("error", message, stage)``. Before each request the worker counts it in shared memory
(:data:`MARK`: requests started, requests finished), from which the parent tells which request a
dead worker was in.

Hung envs time out together (:class:`_Batch`): the worker runs a list's requests in order on its
main thread (no thread is involved while requests are quick); a request still running after
``suspect`` seconds (:func:`suspect_after`: an eighth of ``step_timeout``, at most 1 s) lets
another thread go on with the next ones beside it, so the envs after a hung one are not held up, and
every request running past ``step_timeout`` is its env's error ("did not return within ..."), all of
them found within about one ``step_timeout``. The requests of one env (a replay, then its step) run
in order on one thread. A list with a hung request is answered ``("replace", results)``: the parent
replaces the worker (the hung call still runs in it) and rebuilds its other envs by replay. Envs of
one worker may thus run at the same time only while one of them takes longer than ``suspect``.
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import signal
import struct
import sys
import threading
import time
from typing import Any, Callable, Optional

from pcsd.envs.protocol import EnvBuildError, ProtocolError, check_reset, check_step

__all__ = ["MARK", "Channel", "first_line", "main", "suspect_after"]

#: per worker, in shared memory: requests started, requests finished
MARK = struct.Struct("qq")


class Channel:
    """Pickled messages over one end of a socket pair, each framed by its length (8 bytes): one
    ``write`` per message, and reads of up to 64 KiB into a buffer that keeps what arrived beyond
    the message (the multiprocessing ``Connection`` costs a few more system and Python calls each)."""

    _LEN = struct.Struct("!Q")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()

    def fileno(self) -> int:
        return self.fd

    def send(self, obj: Any) -> None:
        self.send_pickled(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))

    def send_pickled(self, data: bytes) -> None:
        view = memoryview(self._LEN.pack(len(data)) + data)
        while view:
            view = view[os.write(self.fd, view) :]

    def buffered(self) -> bool:
        """Whether a whole message already waits in the buffer (a poll of the socket does not see it)."""
        buf, size = self._buf, self._LEN.size
        return len(buf) >= size and len(buf) >= size + self._LEN.unpack_from(buf)[0]

    def recv(self) -> Any:
        """The next message (EOFError: the other end closed)."""
        buf, size = self._buf, self._LEN.size
        while len(buf) < size or len(buf) < size + self._LEN.unpack_from(buf)[0]:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise EOFError("the channel's other end closed")
            buf += chunk
        end = size + self._LEN.unpack_from(buf)[0]
        obj = pickle.loads(memoryview(buf)[size:end])
        del buf[:end]
        return obj

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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
                try:  # ("expert", slot, privileged): the expert told whether the teacher's text is in the prompt
                    a = fn() if len(op) < 3 or op[2] is None else fn(privileged=bool(op[2]))
                except Exception as exc:
                    return ("error", f"expert_action() raised {first_line(exc)}", "env")
                if a is not None and not isinstance(a, str):
                    return ("error", f"expert_action() returned {type(a).__name__}, expected str or None", "env")
                return ("ok", a if a is None else _plain(a))
            if kind == "has_expert":
                return ("ok", _expert_of(self.env(op[1])) is not None)
            if kind == "expert_takes_privileged":
                return ("ok", expert_takes_privileged(_expert_of(self.env(op[1]))))
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


def _expert_of(env: Any) -> Optional[Callable[..., Any]]:
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


def suspect_after(step_timeout: float) -> float:
    """Seconds a request runs before the requests after it go on beside it (:class:`_Batch`)."""
    return min(1.0, step_timeout / 8)


class _Batch:
    """One list of requests: units (the consecutive requests of one env) claimed in order by the
    threads that run them (the main thread first; see the module docs), each result kept once (the
    first writer wins: a late answer of a request declared hung is dropped), the answer sent by
    whichever thread completes the list. Quick requests take no lock: claims come from an
    ``itertools.count`` and results go into a dict with ``setdefault`` (both atomic under the GIL)."""

    def __init__(self, state: _WorkerState, ops: list, timeout: float, send: Any, mark: Any) -> None:
        self.state, self.ops, self.timeout, self._send, self._mark = state, ops, timeout, send, mark
        units: list[list[int]] = []
        last = None
        for k, op in enumerate(ops):
            slot = op[1] if len(op) > 1 else None
            if units and slot is not None and slot == last:
                units[-1].append(k)  # the same env's slot: after its replay
            else:
                units.append([k])
            last = slot
        self.units = units
        self.n = len(ops)
        self.results: dict[int, Any] = {}
        self.running: dict[int, float] = {}  # request -> when it started
        self.taken: set[int] = set()  # requests past `suspect` whose successors run beside them
        self.hung = False
        self._claims = itertools.count()
        self._sends = itertools.count()

    def work(self) -> None:
        """Runs units until none is left to claim, then sends the answer if it is complete."""
        results, running, mark, run, ops, units = (
            self.results,
            self.running,
            self._mark,
            self.state.run,
            self.ops,
            self.units,
        )
        while True:
            u = next(self._claims)
            if u >= len(units):
                break
            for k in units[u]:
                if k in results:  # an earlier request of its unit hung
                    continue
                running[k] = time.monotonic()
                mark(1, 0)
                r = run(ops[k])
                running.pop(k, None)
                results.setdefault(k, r)
                mark(0, 1)
        self.maybe_send()

    def watch(self, now: float, suspect: float) -> None:
        """The watchdog's look: requests past ``suspect`` let the next ones go on beside them (once
        each), requests past the timeout are their env's error (and the rest of their unit's)."""
        for k, t0 in list(self.running.items()):
            elapsed = now - t0
            if elapsed >= self.timeout:
                self.running.pop(k, None)
                self.hung = True
                unit = next(u for u in self.units if k in u)
                for j in unit[unit.index(k) :]:
                    self.results.setdefault(
                        j,
                        (
                            "error",
                            f"did not return within {self.timeout:g} s (env.step_timeout); its worker process was "
                            "replaced",
                            "env",
                        ),
                    )
            elif elapsed >= suspect and k not in self.taken:
                self.taken.add(k)
                threading.Thread(target=self.work, daemon=True).start()
        self.maybe_send()

    def maybe_send(self) -> None:
        if len(self.results) == self.n and next(self._sends) == 0:
            out = [self.results[k] for k in range(self.n)]
            self._send(("replace", out) if self.hung else out)


def main(sock_fd: int, mark_fd: int, index: int, step_timeout: float = 60.0) -> None:
    """Body of one worker process: receives lists of requests, answers each list with one list of
    results (:class:`_Batch`); counts its requests in shared memory (the parent reads which request
    a dead worker was in) and times out its hung envs itself, together."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    if os.getcwd() not in sys.path:  # envs are importable from the current folder (after the installed packages)
        sys.path.append(os.getcwd())
    conn = Channel(sock_fd)
    mm = mmap.mmap(mark_fd, 0)
    off = index * MARK.size
    counts = [0, 0]  # requests started, finished (the parent zeroed this worker's counters)
    send_lock = threading.Lock()
    current: list[Optional[_Batch]] = [None]
    suspect = suspect_after(step_timeout)

    def mark(started: int, finished: int) -> None:
        counts[0] += started
        counts[1] += finished
        MARK.pack_into(mm, off, counts[0], counts[1])

    def send(out: Any) -> None:
        with send_lock:
            conn.send(out)

    def watchdog() -> None:
        tick = min(0.05, suspect / 4)
        while True:
            time.sleep(tick)
            batch = current[0]
            if batch is not None and len(batch.results) < batch.n:
                try:
                    batch.watch(time.monotonic(), suspect)
                except (OSError, ValueError):  # the parent went away
                    return

    try:
        factory, error = None, None
        try:
            factory = conn.recv()
        except Exception as exc:
            error = f"the env factory could not be unpickled in the worker: {first_line(exc)}"
        state = _WorkerState(factory, error)
        threading.Thread(target=watchdog, daemon=True).start()
        send(("ready", os.getpid()))
        while True:
            ops = conn.recv()
            if ops is None:
                break
            batch = _Batch(state, ops, step_timeout, send, mark)
            current[0] = batch
            batch.work()
        state.close()
    except (EOFError, OSError):  # the parent went away
        pass


def expert_takes_privileged(fn: Optional[Callable[..., Any]]) -> bool:
    """Whether an env's ``expert_action`` takes the keyword ``privileged`` (``expert_action(privileged=
    True)``: the expert that reads what the teacher's prompt shows; ``False``: the one that does not)."""
    import inspect

    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "privileged" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
