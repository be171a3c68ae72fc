"""A pool of Python text environments in worker processes, with the native pool's results and rules.

Environments that follow :mod:`pcsd.envs.protocol` (any ``gymnasium.Env`` on text) run in
``num_workers`` worker processes, each holding a contiguous block of the pool's envs; one call
(:meth:`PythonEnvPool.reset` / :meth:`PythonEnvPool.step`) sends each worker ONE message with the
requests of all its envs and gets one message back (Gymnasium's ``AsyncVectorEnv`` sends one per
env), so the per-step cost of the pipes is shared by the envs of a worker, and CPU-heavy envs
run on as many cores as there are workers. Results are the native pool's
:class:`pcsd.envs.pool.StepBatch`, and the rules are the native pool's:

* Groups (GRPO): env ``i`` plays task ``i // group_size``; the ``group_size`` envs of a group
  reset with the same seed (``seeds[g]``, or ``seed + g``), so they play the same task. Every
  reset of an env uses its group's seed.
* Step limit: with ``max_steps``, the step that brings an episode to ``max_steps`` steps while it
  is still going returns ``done=True, truncated=True``; an env's own ``truncated`` is ``truncated``
  too. ``reward`` is the step's reward, ``score`` the episode's summed reward, ``won`` the env's
  ``info["won"]`` when it reports one, else ``done and score >= success_threshold``.
* Auto-reset (``auto_reset=True``, envpool's rule): the step that ends an episode returns the
  final observation with ``done`` set; the env's next step ignores its action and resets the env.
  Off (pcsd's rollouts): stepping a finished env is that env's error until :meth:`reset`.
* Errors: an exception inside one env's ``reset``/``step``, a result outside the protocol (an
  observation that is not text, ...), a call that does not return within ``step_timeout`` seconds
  (a hang) or a worker process that dies (a crash, ``os._exit``, a segfault) ends THAT env's
  episode: its entry has ``error`` set, ``done`` true, empty ``obs``; the env is broken until it
  is reset, and the other envs and the pool carry on. A hung or dead worker is replaced by a new
  process; the other envs it held are rebuilt there by replaying their episodes (a reset with the
  same seed and options, then their actions), checked against the observation they had reached
  (an env that does not replay to the same observation, i.e. is not deterministic for its seed,
  becomes an error too, never a silent change of state). A malformed call (lengths differ, an id
  twice in one call) raises ValueError naming the argument and changes nothing; an env id out of
  range and an action that is not valid text (a lone surrogate) are that entry's error.
* Ctrl-C while a call waits ends every worker process of the pool and raises KeyboardInterrupt
  (the pool is then closed); closing the pool, dropping it, or the interpreter exiting also ends
  them, and a worker whose parent dies ends itself: no process is left behind.

Worker processes are plain subprocesses of the running interpreter (``sys.executable``) with the
parent's ``sys.path`` (so an env importable here, e.g. from the current folder, is importable
there); the env factory (:class:`pcsd.envs.protocol.EnvFactory` or any picklable callable) is sent
to them, and each builds its envs when they are first reset. :class:`EnvWorkers` can outlive a
pool: the trainer keeps one set of workers (and their env objects) for the whole run and lays a
new :class:`PythonEnvPool` over it for every batch of rollouts.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from pcsd.envs.experts import ExpertEpisode
from pcsd.envs.pool import StepBatch, _actions, _env_ids, _int_arg
from pcsd.envs.protocol import EnvBuildError, ProtocolError
from pcsd.envs.pyworker import MARK as _MARK
from pcsd.envs.pyworker import Channel
from pcsd.envs.pyworker import first_line as _first_line

__all__ = ["EnvWorkers", "PythonEnvPool", "check_env", "EnvCheck", "play_experts"]


# ----------------------------------------------------------------------------- the workers
@dataclass
class _Fault:
    """A worker that hung or died during a list of requests: ``culprit`` is the request it was in
    (None: it died between requests); ``retry``: none of the requests had started (they can be
    sent again to the new worker); ``reason`` says what happened."""

    culprit: Optional[int]
    reason: str
    retry: bool = False


class _Proc:
    def __init__(self, proc: subprocess.Popen, conn: Channel) -> None:
        self.proc, self.conn, self.ready = proc, conn, False


def _kill(procs: list) -> None:
    for p in procs:
        if p is None:
            continue
        try:
            p.conn.send(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 2.0
    for p in procs:
        if p is None:
            continue
        try:
            p.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()
        try:
            p.conn.close()
        except OSError:
            pass


#: seconds a new worker process may take to start (Python and its imports) before it counts as hung
START_TIMEOUT = 120.0

#: seconds a call to one worker polls its socket before sleeping on it. Sleeping costs a wake-up
#: through the scheduler when the answer comes (on a virtual machine an idle core's wake-up is most
#: of a quick env's round trip); a quick env answers within this window. Polling pays only with a
#: core to spare: on a full machine each yield between polls may give the core away for a time
#: slice. So a pool measures both ways as it goes (:class:`_WaitChoice`) and polls only while that
#: is the quicker one. A worker whose last answer took longer than :data:`SPIN_UNTIL` is waited for
#: asleep at once (slow envs cost no polling).
SPIN_S = 200e-6
SPIN_UNTIL = 1e-3


def answered_within(fd: int, seconds: float) -> bool:
    """Whether ``fd`` becomes readable within ``seconds``, polled without sleeping: the first half
    of the window on the core, the second yielding it between polls (on a full machine the other
    end may be waiting for the core; a yield that finds another task costs its time slice)."""
    now = time.perf_counter()
    end, mid = now + seconds, now + seconds / 2
    while not select.select([fd], [], [], 0)[0]:
        now = time.perf_counter()
        if now >= end:
            return False
        if now >= mid:
            os.sched_yield()
    return True


class _WaitChoice:
    """Whether to poll before sleeping (:data:`SPIN_S`), chosen by measurement: a moving average of
    the wait for an answer under each way, the quicker one used, the other tried every
    :attr:`EXPLORE` th call (and until each has :attr:`WARM` measurements)."""

    EXPLORE = 16
    WARM = 4
    DECAY = 0.9

    def __init__(self) -> None:
        self.avg = [0.0, 0.0]  # seconds: sleeping, polling
        self.n = [0, 0]
        self.calls = 0

    def poll(self) -> bool:
        self.calls += 1
        if min(self.n) < self.WARM:
            return self.n[1] <= self.n[0]
        best = self.avg[1] <= self.avg[0]
        return (not best) if self.calls % self.EXPLORE == 0 else best

    def record(self, polled: bool, seconds: float) -> None:
        k = int(polled)
        self.avg[k] = seconds if self.n[k] == 0 else self.DECAY * self.avg[k] + (1 - self.DECAY) * seconds
        self.n[k] += 1


class EnvWorkers:
    """``num_workers`` worker processes that build envs with ``make_env`` and run requests for
    them (the machinery under :class:`PythonEnvPool`; it knows no groups or episodes).

    Args:
        make_env: a picklable callable returning one env (:class:`pcsd.envs.protocol.EnvFactory`).
        num_workers: processes (0: one per core).
        step_timeout: seconds one request (a reset with the env's construction, a step, an
            expert action) may take before its worker counts as hung and is replaced.
        quiet: the workers' own output (the envs' prints, a library's download attempts) goes
            nowhere instead of to this process's stdout/stderr (:func:`check_env`: its verdict is
            one line).
        spin_s: seconds to poll a lone worker's socket for its answer before sleeping on it (the
            default :data:`SPIN_S`, used while measured quicker; 0: sleep at once).
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        num_workers: int = 0,
        *,
        step_timeout: float = 60.0,
        quiet: bool = False,
        spin_s: float = SPIN_S,
    ) -> None:
        if not callable(make_env):
            raise ValueError(f"make_env: expected a callable that builds one env, got {type(make_env).__name__}")
        try:
            self._factory = pickle.dumps(make_env)
        except Exception as exc:
            raise ValueError(
                f"make_env: must be picklable to reach the worker processes ({_first_line(exc)}); "
                "use pcsd.envs.protocol.EnvFactory('module:Class', kwargs=...)"
            ) from None
        n = _int_arg("num_workers", num_workers, 0) or (os.cpu_count() or 1)
        if isinstance(step_timeout, bool) or not isinstance(step_timeout, (int, float)) or not step_timeout > 0:
            raise ValueError(f"step_timeout: expected a positive number of seconds, got {step_timeout!r}")
        self.step_timeout = float(step_timeout)
        if isinstance(spin_s, bool) or not isinstance(spin_s, (int, float)) or not 0 <= spin_s <= SPIN_UNTIL:
            raise ValueError(f"spin_s: expected seconds in [0, {SPIN_UNTIL}], got {spin_s!r}")
        self.spin_s = float(spin_s)
        self._output = subprocess.DEVNULL if quiet else None
        self.describe = getattr(make_env, "describe", lambda: repr(make_env))()
        self._marks_file = tempfile.TemporaryFile(prefix="pcsd-envworkers-")
        self._marks_file.truncate(_MARK.size * n)
        self._marks = mmap.mmap(self._marks_file.fileno(), 0)
        self._procs: list[Optional[_Proc]] = [None] * n
        #: per worker: how many times it was replaced (a pool rebuilds its envs there after a change)
        self.generation = [0] * n
        self._closed = False
        self._last_wait = 0.0  # seconds the last call to one worker waited for its answer (spin_s)
        self._wait = _WaitChoice()
        self._finalizer = weakref.finalize(self, _kill, self._procs)
        for w in range(n):
            self._start(w)

    @property
    def num_workers(self) -> int:
        return len(self._procs)

    @property
    def closed(self) -> bool:
        return self._closed

    def pids(self) -> list[int]:
        return [p.proc.pid for p in self._procs if p is not None]

    def _start(self, w: int) -> None:
        import socket

        _MARK.pack_into(self._marks, w * _MARK.size, 0, 0)
        a, b = socket.socketpair()
        parent = Channel(a.detach())
        child_fd = b.detach()
        path = [p if p else os.getcwd() for p in sys.path]
        code = (
            "import sys; sys.path[:0] = " + repr(path) + "; from pcsd.envs.pyworker import main; "
            f"main({child_fd}, {self._marks_file.fileno()}, {w}, {self.step_timeout!r})"
        )
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=(child_fd, self._marks_file.fileno()),
                stdin=subprocess.DEVNULL,
                stdout=self._output,
                stderr=self._output,
                start_new_session=False,
            )
        finally:
            os.close(child_fd)
        parent.send_pickled(self._factory)
        self._procs[w] = _Proc(proc, parent)

    def _proc(self, w: int) -> _Proc:
        proc = self._procs[w]
        assert proc is not None, f"worker {w} is not running"
        return proc

    def _mark(self, w: int) -> tuple[int, int]:
        return _MARK.unpack_from(self._marks, w * _MARK.size)

    def _replace(self, w: int) -> None:
        p = self._procs[w]
        if p is not None:
            p.proc.kill()
            p.proc.wait()
            p.conn.close()
        self.generation[w] += 1
        self._start(w)

    def run(self, batches: Mapping[int, list[tuple]]) -> dict[int, Any]:
        """Sends each worker its list of requests and waits for every answer: per worker a list
        of ``("ok", value)`` / ``("error", message, stage)``, or a :class:`_Fault` when the worker
        hung (no progress for ``step_timeout`` seconds) or died; a faulty worker is replaced by a
        new process (with no envs) before this returns."""
        if self._closed:
            raise RuntimeError("EnvWorkers: closed")
        out: dict[int, Any] = {}
        start: dict[int, tuple[int, int]] = {}
        pending: set[int] = set()
        for w, ops in batches.items():
            start[w] = self._mark(w)
            try:
                self._proc(w).conn.send(ops)
                pending.add(w)
            except (OSError, ValueError):  # it had died while idle: nothing of this call started
                self._replace(w)
                out[w] = _Fault(None, "its worker process had exited; a new one took its place", retry=True)
        # the worker times its requests out itself (all its hung envs together, pcsd.envs.pyworker); this
        # limit is for a worker that cannot even do that (stuck in C code holding the GIL, or starting)
        grace = self.step_timeout + max(1.0, 0.25 * self.step_timeout)
        sent = time.monotonic()
        if len(pending) == 1:  # the quick way for one worker already started: wait on its socket alone
            (w,) = pending
            p = self._proc(w)
            polled = self.spin_s > 0 and self._last_wait < SPIN_UNTIL and self._wait.poll()
            if p.ready and (
                p.conn.buffered()
                or (polled and answered_within(p.conn.fd, self.spin_s))
                or select.select([p.conn.fd], [], [], grace)[0]
            ):
                self._last_wait = time.monotonic() - sent
                if self._last_wait < SPIN_UNTIL:
                    self._wait.record(polled, self._last_wait)
                try:
                    msg = p.conn.recv()
                except (EOFError, OSError):
                    out[w] = self._fault(w, start[w], len(batches[w]), hung=False)
                    return out
                if type(msg) is tuple and msg[0] == "replace":  # some env of it hung: it runs in there still
                    self._replace(w)
                    msg = msg[1]
                out[w] = msg
                return out
        seen = {w: (start[w], sent) for w in pending}

        def limit(w: int) -> float:  # a worker's start (Python, imports) is not a request's time
            return grace if self._proc(w).ready else max(grace, START_TIMEOUT)

        poller = select.poll()  # one poll() over the workers' sockets (an answer, or EOF of a dead one)
        by_fd = {}
        for w in pending:
            fd = self._proc(w).conn.fileno()
            poller.register(fd, select.POLLIN)
            by_fd[fd] = w

        def done(w: int) -> None:
            poller.unregister(self._proc(w).conn.fileno())
            pending.discard(w)

        while pending:
            now = time.monotonic()
            timeout = max(0.0, min(seen[w][1] + limit(w) for w in pending) - now)
            for fd, _ in poller.poll(int(timeout * 1000) + 1):
                w = by_fd[fd]
                p = self._proc(w)
                try:
                    msg = p.conn.recv()
                except (EOFError, OSError):
                    done(w)
                    out[w] = self._fault(w, start[w], len(batches[w]), hung=False)
                    continue
                if not p.ready:  # its first message says it started; the answer follows
                    p.ready = True
                    seen[w] = (self._mark(w), time.monotonic())
                    if not p.conn.buffered():  # (the answer may have come in the same read)
                        continue
                    msg = p.conn.recv()
                done(w)
                if type(msg) is tuple and msg[0] == "replace":  # some env of it hung: it runs in there still
                    self._replace(w)
                    msg = msg[1]
                out[w] = msg
            now = time.monotonic()
            for w in list(pending):
                m = self._mark(w)
                if m != seen[w][0]:
                    seen[w] = (m, now)
                elif now - seen[w][1] >= limit(w):
                    done(w)
                    out[w] = self._fault(w, start[w], len(batches[w]), hung=True)
        return out

    def _fault(self, w: int, start: tuple[int, int], n_ops: int, hung: bool) -> _Fault:
        started, finished = self._mark(w)
        code = None
        if not hung:
            try:
                code = self._proc(w).proc.wait(5.0)
            except subprocess.TimeoutExpired:
                code = None
        k = started - start[0] - 1  # the request it was in, when one had started and not finished
        culprit = k if started > finished and 0 <= k < n_ops else None
        self._replace(w)
        if hung:
            what = f"did not return within {self.step_timeout:g} s (env.step_timeout); its worker process was replaced"
        else:
            sig = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            what = f"its worker process died ({sig}) during the call; a new one took its place"
        return _Fault(culprit, what, retry=culprit is None and started == start[0])

    def terminate(self) -> None:
        """Ends every worker now (SIGKILL), without waiting for running requests."""
        for p in self._procs:
            if p is not None:
                p.proc.kill()
        self.close()

    def close(self) -> None:
        """Ends the worker processes (their envs' ``close()`` runs first); later calls raise."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _kill(self._procs)
        self._marks.close()
        self._marks_file.close()

    def __enter__(self) -> EnvWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EnvWorkers({self.describe}, num_workers={self.num_workers}{', closed' if self._closed else ''})"


# ----------------------------------------------------------------------------- the pool
_RESET, _STEP = "reset", "step"


class PythonEnvPool:
    """A batched pool of ``num_envs`` Python text environments in worker processes (see the
    module docs for the rules); the native :class:`pcsd.envs.pool.EnvPool`'s synchronous API.

    Args:
        make_env: a picklable callable building one env (:class:`pcsd.envs.protocol.EnvFactory`),
            or an :class:`EnvWorkers` to lay the pool over (the pool then does not own them:
            :meth:`close` leaves them running).
        num_envs: number of envs; a multiple of ``group_size``.
        group_size: envs per task (GRPO group).
        seeds: the reset seed of each group (``num_envs // group_size`` ints); default ``seed + g``.
        seed: base seed when ``seeds`` is not given.
        max_steps: per-episode step limit (``truncated`` when hit); ``None``: no limit.
        num_workers: worker processes when ``make_env`` is a factory (0: one per core, at most
            ``num_envs``).
        auto_reset: the auto-reset rule; off: finished envs wait for :meth:`reset`.
        step_timeout: seconds one call of one env may take (a hang past it is that env's error).
        success_threshold: ``won`` = ``done and score >= success_threshold`` for envs that do not
            report ``info["won"]`` (None: such envs never win).
        options: the ``options`` passed to every ``reset``.
    """

    kind = "python"

    def __init__(
        self,
        make_env: Callable[[], Any] | EnvWorkers,
        num_envs: int,
        *,
        group_size: int = 1,
        seeds: Optional[Sequence[int]] = None,
        seed: int = 0,
        max_steps: Optional[int] = 50,
        num_workers: int = 0,
        auto_reset: bool = False,
        step_timeout: float = 60.0,
        success_threshold: Optional[float] = 1.0,
        options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        num_envs = _int_arg("num_envs", num_envs, 1)
        group_size = _int_arg("group_size", group_size, 1)
        if num_envs % group_size:
            raise ValueError(f"num_envs: must be a multiple of group_size ({group_size}), got {num_envs}")
        n_groups = num_envs // group_size
        if seeds is None:
            seeds = [_int_arg("seed", seed, 0) + g for g in range(n_groups)]
        else:
            if isinstance(seeds, (str, bytes)):
                raise ValueError("seeds: expected a list of ints, one per group")
            seeds = _env_ids(seeds, "seeds")
            if len(seeds) != n_groups:
                raise ValueError(
                    f"seeds: expected one seed per group ({num_envs} envs / group_size {group_size} = "
                    f"{n_groups}), got {len(seeds)}"
                )
            for k, s in enumerate(seeds):
                if not 0 <= s < 2**63:
                    raise ValueError(f"seeds[{k}]: expected an int in [0, 2**63), got {s}")
        self._max_steps = None if max_steps is None else _int_arg("max_steps", max_steps, 1)
        if not isinstance(auto_reset, (bool, np.bool_)):
            raise ValueError(f"auto_reset: expected a bool, got {auto_reset!r}")
        if success_threshold is not None and (
            isinstance(success_threshold, bool)
            or not isinstance(success_threshold, (int, float))
            or not np.isfinite(success_threshold)
        ):
            raise ValueError(f"success_threshold: expected a finite number or None, got {success_threshold!r}")
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"options: expected a mapping or None, got {type(options).__name__}")
        if isinstance(make_env, EnvWorkers):
            if make_env.closed:
                raise ValueError("make_env: the EnvWorkers are closed")
            self._workers, self._owned = make_env, False
        else:
            workers = _int_arg("num_workers", num_workers, 0) or min(os.cpu_count() or 1, num_envs)
            self._workers = EnvWorkers(make_env, min(workers, num_envs), step_timeout=step_timeout)
            self._owned = True
        self._n, self._group = num_envs, group_size
        self._seeds = list(seeds)
        self._auto_reset = bool(auto_reset)
        self._threshold = None if success_threshold is None else float(success_threshold)
        self._options = None if options is None else dict(options)
        W = self._workers.num_workers
        # env e lives in worker e * W // n, local slot e - first env of that worker
        self._worker_of = [e * W // num_envs for e in range(num_envs)]
        first: dict[int, int] = {}
        for e, w in enumerate(self._worker_of):
            first.setdefault(w, e)
        self._slot = [e - first[w] for e, w in enumerate(self._worker_of)]
        self._gen = list(self._workers.generation)
        # per env: "new" (never reset), "live", "done", "broken"
        self._state = ["new"] * num_envs
        self._actions: list[list[str]] = [[] for _ in range(num_envs)]  # this episode's actions (replay)
        self._last_obs = [""] * num_envs
        self._score = [0.0] * num_envs
        self._steps = [0] * num_envs
        self._task = [""] * num_envs
        self._task_type = [""] * num_envs
        self._privileged = [""] * num_envs  # the env's latest info["privileged"]
        self._stale = [False] * num_envs  # lost with a replaced worker: replay before its next step
        self._closed = False

    # ---- properties (as EnvPool's) ----
    @property
    def num_envs(self) -> int:
        return self._n

    @property
    def num_games(self) -> int:
        return self._n // self._group

    @property
    def group_size(self) -> int:
        return self._group

    @property
    def num_workers(self) -> int:
        return self._workers.num_workers

    @property
    def max_steps(self) -> Optional[int]:
        return self._max_steps

    @property
    def auto_reset(self) -> bool:
        return self._auto_reset

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def workers(self) -> EnvWorkers:
        return self._workers

    def __len__(self) -> int:
        return self._n

    def task_of(self, env_id: int) -> tuple[str, str]:
        """``(task_type, task)`` of an env's current episode (the reset's ``info``; the task falls
        back to the first observation, the task type to ``""``)."""
        e = _env_ids([env_id], "env_id")[0]
        if not 0 <= e < self._n:
            raise ValueError(f"env_id: expected 0 <= id < {self._n}, got {e}")
        return self._task_type[e], self._task[e]

    # ---- calls ----
    def reset(self, env_ids: Optional[Iterable[int]] = None) -> StepBatch:
        """Resets the given envs (default: all) with their group's seed; results in id order."""
        self._check_open()
        ids = list(range(self._n)) if env_ids is None else _env_ids(env_ids)
        return self._call(ids, [None] * len(ids), reset=True)

    def step(self, actions: Sequence[str], env_ids: Optional[Iterable[int]] = None) -> StepBatch:
        """Steps each env id with its action (default ids: all envs, one action each); results in
        the order of the ids."""
        self._check_open()
        acts = _actions(actions)
        if env_ids is None:
            if len(acts) != self._n:
                raise ValueError(f"actions: without env_ids, expected one action per env ({self._n}), got {len(acts)}")
            ids = list(range(self._n))
        else:
            ids = _env_ids(env_ids)
            if len(ids) != len(acts):
                raise ValueError(f"actions: expected one action per env id ({len(ids)}), got {len(acts)}")
        return self._call(ids, acts, reset=False)

    def expert_actions(self, env_ids: Iterable[int], privileged: Optional[bool] = None) -> list[Optional[str]]:
        """Each env's ``expert_action()`` now (None where its expert has nothing to do); raises
        RuntimeError naming the env when one has no expert or its expert fails. ``privileged``
        (True / False): ``expert_action(privileged=...)``, the expert told whether the teacher's
        privileged text is in the prompt (None: called without it)."""
        self._check_open()
        ids = _env_ids(env_ids)
        self._check_ids(ids)
        for e in ids:
            if self._state[e] != "live":
                raise RuntimeError(f"env {e}: expert_action() needs an episode in progress (state {self._state[e]})")
        res = self._send([(e, ("expert", self._slot[e], privileged)) for e in ids])
        out = []
        for e, r in zip(ids, res):
            if r[0] != "ok":
                raise RuntimeError(f"env {e}: {r[1]}")
            out.append(r[1])
        return out

    def has_expert(self) -> bool:
        """Whether the envs offer ``expert_action()`` (asked of env 0, built if needed)."""
        self._check_open()
        r = self._send([(0, ("has_expert", self._slot[0]))])[0]
        if r[0] != "ok":
            raise RuntimeError(f"env 0: {r[1]}")
        return bool(r[1])

    def close(self) -> None:
        """Closes the pool (and its worker processes, when it started them). Later calls raise."""
        if self._closed:
            return
        self._closed = True
        if self._owned:
            self._workers.close()

    def __enter__(self) -> PythonEnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return "PythonEnvPool(closed)"
        return (
            f"PythonEnvPool({self._workers.describe}, num_envs={self._n}, group_size={self._group}, "
            f"num_workers={self.num_workers}, max_steps={self._max_steps}, auto_reset={self._auto_reset})"
        )

    # ---- internals ----
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("PythonEnvPool: closed")
        if self._workers.closed:
            raise RuntimeError("PythonEnvPool: its worker processes were closed")

    def _check_ids(self, ids: list[int]) -> None:
        if len(set(ids)) != len(ids):
            dup = next(e for e in ids if ids.count(e) > 1)
            raise ValueError(f"env_ids: env {dup} appears twice in one call")

    def _seed_of(self, e: int) -> int:
        return self._seeds[e // self._group]

    def _send(self, reqs: list[tuple[int, tuple]]) -> list[tuple]:
        """Runs one request per entry (env id, request) on the envs' workers; returns the worker's
        result per entry (``("ok", value)`` or ``("error", message, stage)``). Envs on a replaced
        worker are rebuilt by replay first; a hang or crash is the error of the env whose request
        it was in."""
        results: list[Optional[tuple]] = [None] * len(reqs)
        todo: list[int] = list(range(len(reqs)))
        retries: dict[int, int] = {}
        worker_of, stale = self._worker_of, self._stale
        try:
            while todo:
                self._note_replacements()
                batches: dict[int, list[tuple]] = {}
                where: dict[int, list[int]] = {}  # worker -> the entry of each request (~entry: its replay)
                for k in todo:
                    e, op = reqs[k]
                    w = worker_of[e]
                    b = batches.get(w)
                    if b is None:
                        b = batches[w] = []
                        where[w] = []
                    if stale[e] and op[0] != _RESET:
                        b.append(
                            (
                                "replay",
                                self._slot[e],
                                self._seed_of(e),
                                self._options,
                                list(self._actions[e]),
                                self._last_obs[e],
                            )
                        )
                        where[w].append(~k)
                    b.append(op)
                    where[w].append(k)
                out = self._workers.run(batches)
                again_k: list[int] = []
                for w, res in out.items():
                    if isinstance(res, _Fault):
                        retries[w] = retries.get(w, 0) + 1
                        again = res.retry and retries[w] <= 2
                        for j, k in enumerate(where[w]):
                            k = k if k >= 0 else ~k
                            if not again and (res.culprit is None or j == res.culprit):
                                if results[k] is None:
                                    results[k] = ("error", res.reason, "env")
                                stale[reqs[k][0]] = False
                            elif results[k] is None and k not in again_k:
                                again_k.append(k)  # run again on the new worker (after a replay)
                        self._mark_lost(w, keep={reqs[k if k >= 0 else ~k][0] for k in where[w]})
                        continue
                    for k, r in zip(where[w], res):
                        if k >= 0:
                            if results[k] is None:  # else its replay failed: that is its result
                                results[k] = r
                            continue
                        k = ~k
                        stale[reqs[k][0]] = False
                        if r[0] != "ok":
                            results[k] = r
                todo = [k for k in again_k if results[k] is None]
                for k in todo:
                    e = reqs[k][0]
                    if self._state[e] == "live" and reqs[k][1][0] != _RESET:
                        stale[e] = True
        except BaseException:
            if any(r is None for r in results):  # interrupted (Ctrl-C) mid-call: no worker is left behind
                self._workers.terminate()
                self._closed = True
            raise
        return results  # type: ignore[return-value]

    def _note_replacements(self) -> None:
        if self._workers.generation == self._gen:  # the common case: no worker was replaced
            return
        for w, g in enumerate(self._workers.generation):
            if g != self._gen[w]:
                self._gen[w] = g
                self._mark_lost(w, keep=set())

    def _mark_lost(self, w: int, keep: set[int]) -> None:
        """The envs of worker ``w`` lost their state: live ones are replayed before their next use."""
        self._gen[w] = self._workers.generation[w]
        for e in range(self._n):
            if self._worker_of[e] == w and self._state[e] == "live" and e not in keep:
                self._stale[e] = True

    def _call(self, ids: list[int], acts: Sequence[Optional[str]], reset: bool) -> StepBatch:
        self._check_ids(ids)
        cols = _Columns(len(ids))
        reqs: list[tuple[int, tuple]] = []
        rows: list[int] = []
        state, slot, n = self._state, self._slot, self._n
        plain_text = True  # one check of every action's text (the common case); one by one when it fails
        if not reset:
            try:
                "".join(acts).encode("utf-8")  # type: ignore[arg-type]
            except UnicodeEncodeError:
                plain_text = False
        for row, e in enumerate(ids):
            if not 0 <= e < n:
                cols.error(row, f"env id {e} out of range [0, {n})")
                continue
            st = state[e]
            if reset or (st == "done" and self._auto_reset):
                reqs.append((e, (_RESET, slot[e], self._seed_of(e), self._options)))
                rows.append(row)
                continue
            if st != "live":
                why = {
                    "new": "was never reset (call reset first)",
                    "done": "finished its episode (auto_reset is off: reset it first)",
                    "broken": "is broken by an earlier error (reset it first)",
                }[st]
                cols.error(row, f"env {e} {why}")
                continue
            a = acts[row]
            if not plain_text:
                try:
                    a.encode("utf-8")  # type: ignore[union-attr]
                except UnicodeEncodeError:
                    cols.error(row, "action is not valid text (a lone surrogate): not sent to the env")
                    state[e] = "broken"
                    continue
            reqs.append((e, (_STEP, slot[e], a)))
            rows.append(row)
        res = self._send(reqs) if reqs else []
        threshold = self._threshold
        for row, (e, op), r in zip(rows, reqs, res):
            if r[0] != "ok":
                state[e] = "broken"
                self._stale[e] = False
                cols.error(row, f"env {e}: {r[1]}")
                continue
            obs, reward, terminated, truncated, task, adm, won, task_type, privileged, anchor = r[1]
            if op[0] == _RESET:
                state[e] = "live"
                self._actions[e] = []
                self._score[e], self._steps[e] = 0.0, 0
                self._task[e] = task if task is not None else obs
                self._task_type[e] = task_type or ""
                self._privileged[e] = privileged or ""
                self._stale[e] = False
                done = False
            else:
                self._actions[e].append(op[2])
                self._steps[e] += 1
                self._score[e] += reward
                limit = self._max_steps is not None and self._steps[e] >= self._max_steps
                done = terminated or truncated or limit
                truncated = truncated or (limit and not terminated)
                if done:
                    state[e] = "done"
                if privileged is not None:
                    self._privileged[e] = privileged
            self._last_obs[e] = obs
            if won is None:
                won = done and threshold is not None and self._score[e] >= threshold
            cols.put(
                row,
                obs,
                adm or [],
                reward,
                self._score[e],
                done,
                won,
                truncated,
                task_type or self._task_type[e],
                self._steps[e],
                self._privileged[e],
                anchor,
            )
        return cols.batch(ids)


class _Columns:
    """The columns of one StepBatch, filled row by row (an error row: ``done``, empty, reward 0)."""

    def __init__(self, n: int) -> None:
        self.obs = [""] * n
        self.adm: list[list[str]] = [[] for _ in range(n)]
        self.reward = [0.0] * n
        self.score = [0.0] * n
        self.done = [True] * n
        self.won = [False] * n
        self.truncated = [False] * n
        self.task_type = [""] * n
        self.steps = [0] * n
        self.privileged = [""] * n
        self.err = [""] * n
        self.anchor: list[Optional[str]] = [None] * n  # info["anchor"] where the env gave one

    def error(self, row: int, message: str) -> None:
        self.err[row] = message

    def put(
        self, row, obs, adm, reward, score, done, won, truncated, task_type, steps, privileged, anchor=None
    ) -> None:
        self.obs[row], self.adm[row], self.anchor[row] = obs, adm, anchor
        self.reward[row], self.score[row] = reward, score
        self.done[row], self.won[row], self.truncated[row] = done, won, truncated
        self.task_type[row], self.steps[row], self.privileged[row] = task_type, steps, privileged

    def batch(self, ids: list[int]) -> StepBatch:
        return StepBatch(
            env_id=np.array(ids, dtype=np.int64),
            obs=self.obs,
            admissible=self.adm,
            reward=np.array(self.reward, dtype=np.float64),
            score=np.array(self.score, dtype=np.float64),
            done=np.array(self.done, dtype=np.bool_),
            won=np.array(self.won, dtype=np.bool_),
            truncated=np.array(self.truncated, dtype=np.bool_),
            task_type=self.task_type,
            step_count=np.array(self.steps, dtype=np.int64),
            error=self.err,
            has_search_bar=np.zeros(len(ids), dtype=np.bool_),
            privileged=self.privileged,
            anchor=self.anchor,
        )


# ----------------------------------------------------------------------------- checks and experts
@dataclass(frozen=True)
class EnvCheck:
    """What :func:`check_env` saw of one env: the task and observation at reset, the admissible
    actions (None: the env lists none), the action it stepped with, whether there is an expert and
    whether the env gave privileged text (``info["privileged"]``, at the reset or the step)."""

    task: str
    observation: str
    admissible: Optional[list[str]]
    action: str
    has_expert: bool
    privileged: bool = False
    expert_takes_privileged: bool = False  # expert_action(privileged=...) (optim.sft_teacher_demos=skills)


def check_env(make_env: Callable[[], Any], *, seed: int = 0, timeout: float = 60.0) -> EnvCheck:
    """Builds one env in a worker process and plays a reset (with ``seed``) and a step, as
    Gymnasium's ``check_env`` does for its API: raises :class:`pcsd.envs.protocol.EnvBuildError`
    when the env cannot be built (``stage``: importing or constructing failed) and
    :class:`pcsd.envs.protocol.ProtocolError` when a call raises, hangs past ``timeout`` seconds,
    kills its process or returns something outside the protocol (a non-text observation, ...),
    each with a one-line message (the worker's own output is dropped). The step's action is the expert's, else the first admissible
    action, else ``"help"``."""

    def call(op: tuple, what: str) -> Any:
        res = workers.run({0: [op]})[0]
        res = res if isinstance(res, _Fault) else res[0]
        if isinstance(res, _Fault):
            raise ProtocolError(f"{what} {res.reason.replace('env.step_timeout', 'the check')}")
        if res[0] != "ok":
            if res[2] in ("import", "construct"):
                raise EnvBuildError(res[2], res[1].removeprefix("building the env: "))
            raise ProtocolError(res[1].replace("step()", what, 1))  # names the action it stepped with
        return res[1]

    with EnvWorkers(make_env, 1, step_timeout=timeout, quiet=True) as workers:
        obs, _, _, _, task, adm, _, _, privileged, _ = call(("reset", 0, seed, None), "reset()")
        has_expert = call(("has_expert", 0), "expert_action()")
        takes = bool(call(("expert_takes_privileged", 0), "expert_action()")) if has_expert else False
        action = call(("expert", 0), "expert_action()") if has_expert else None
        if action is None:
            action = adm[0] if adm else "help"
        stepped = call(("step", 0, action), f"step({action!r})")
    return EnvCheck(
        task=task if task is not None else obs,
        observation=obs,
        admissible=adm or None,
        action=action,
        has_expert=has_expert,
        privileged=bool(privileged) or bool(stepped[8]),
        expert_takes_privileged=takes,
    )


def play_experts(pool: PythonEnvPool, privileged: Optional[bool] = None) -> list[ExpertEpisode]:
    """One expert episode per env of ``pool`` (reset first, played to ``done`` or the pool's step
    limit, stopping where the expert returns None): the agent's view of each step (observation,
    admissible actions, the expert's action) and ``won``. An env error ends that episode unwon.
    ``privileged``: passed to every ``expert_action`` call (:meth:`PythonEnvPool.expert_actions`)."""
    b = pool.reset()
    eps = [ExpertEpisode(task=pool.task_of(e)[1], task_type=pool.task_of(e)[0]) for e in range(pool.num_envs)]
    obs = {int(e): (o, a) for e, o, a, err in zip(b.env_id, b.obs, b.admissible, b.error) if not err}
    active = sorted(obs)
    while active:
        acts = pool.expert_actions(active, privileged)
        go = [(e, a) for e, a in zip(active, acts) if a is not None]
        if not go:
            break
        for e, a in go:
            eps[e].steps.append((obs[e][0], list(obs[e][1]), a))
        s = pool.step([a for _, a in go], [e for e, _ in go])
        active = []
        for e, o, adm, done, won, err in zip(s.env_id.tolist(), s.obs, s.admissible, s.done, s.won, s.error):
            if err:
                continue
            obs[e] = (o, adm)
            if done:
                eps[e].won = bool(won)
            else:
                active.append(e)
    return eps
