"""OpenEnv environment servers as pcsd text environments.

An OpenEnv environment (``openenv-core``: an ``Environment`` subclass with pydantic ``Action`` and
``Observation`` types, served by ``create_app(...)`` under uvicorn) is played through its server.
:class:`OpenEnvEnv` is a client of that server in pcsd's text-env protocol::

    env = OpenEnvEnv("http://127.0.0.1:8000")             # a running server
    env = OpenEnvEnv(start="my_env.server:app")             # or one it starts (module:attribute)
    obs, info = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("42")

**Wire protocol** (openenv-core 0.3.0, ``openenv/core/env_server/http_server.py``): an episode
lives in a WebSocket session at ``<base_url>/ws``, one server-side environment per connection:
the client sends ``{"type": "reset", "data": {...}}``, ``{"type": "step", "data": <action
fields>}``, ``{"type": "state"}`` and ``{"type": "close"}``; the server answers ``{"type":
"observation", "data": {"observation": {...}, "reward": r, "done": d}}``, ``{"type": "state",
...}`` or ``{"type": "error", "data": {"message", "code"}}``. (The HTTP ``POST /reset`` and
``/step`` routes build a fresh environment per request, so they cannot carry an episode.) ``GET
/schema`` gives the Action and Observation JSON schemas, ``GET /health`` the liveness. The client
speaks this directly with the ``websockets`` library: openenv-core's own ``EnvClient`` runs an
asyncio loop thread per client, and importing ``openenv.core`` imports gradio (~10 s), in every
process that holds envs.

**Text in, text out.** Supported servers: an Action with one text field (a ``str``, such as the
echo env's ``EchoAction.message`` or OpenEnv's TextArena env's ``message``) and no other required
field, and an Observation with one text field (besides ``reward``, ``done``, ``metadata``).
Where a schema has several, name them (``action_field=``, ``observation_field=``). A server whose
Action has no text field or needs other fields (``MoveAction(x: int, y: int)``, a tokens tensor)
cannot be played from text: made or checked against one, this raises one line saying so.

- **Task**: the reset observation's field ``task`` when the Observation has one (or the field named
  by ``task_field=``), else the reset observation's text (no ``info["task"]`` when both are empty).
- **Reward**: the step's ``reward`` (``None`` -> ``0.0``); ``terminated`` is ``done``; ``truncated``
  is always ``False`` (OpenEnv has no truncation; pcsd's step limit truncates).
- **info**: Observation fields named after the protocol's info keys pass through (``won``: bool,
  ``admissible_actions``: list of str, ``task_type``: str). A step the server rejects because the
  action text does not fit the Action's schema (a ``min_length``, a pattern) is an invalid move:
  the observation says why, ``info["invalid_move"]`` is ``True``, the episode goes on.
- ``reset(options=...)``: the options are passed as the server env's ``reset`` keyword arguments
  (the server drops those its ``reset`` does not take).

**Errors**, one line each: a wrong address or a server that is not up (``ConnectionError``), a
server that is not OpenEnv or whose types cannot be mapped (``ValueError``), a server that dies
mid-episode (``ConnectionError`` from that env's ``step``; the next ``reset`` reconnects), a server
that does not answer in ``message_timeout_s`` (``TimeoutError``), an environment that raises on
the server (``RuntimeError`` with the server's message), a server at its session limit
(``RuntimeError``: serve it with ``create_app(..., max_concurrent_envs=N)`` and an Environment
with ``SUPPORTS_CONCURRENT_SESSIONS = True``).

**Starting a server**: :class:`OpenEnvServer` runs ``uvicorn`` on ``module:attribute`` (importable
from the current folder or the installed packages, or from ``app_dir``) in a child process on a
free 127.0.0.1 port, waits for ``/health`` and stops it on ``stop()``; the child also exits when its
parent dies. ``OpenEnvEnv(start=...)`` shares one such server among the envs of a process.
"""

from __future__ import annotations

import atexit
import importlib.util
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = ["OpenEnvEnv", "OpenEnvServer", "ServerSpec", "check", "inspect_server", "PACKAGE_HINT"]

PACKAGE_HINT = "pip install 'pcsd[openenv]' (openenv-core==0.3.0)"

#: Observation fields that are the protocol's info keys, with the JSON type each must have.
INFO_FIELDS = {"won": "boolean", "admissible_actions": "array", "task_type": "string"}
_OBS_RESERVED = {"reward", "done", "metadata"}


def _line(text: Any) -> str:
    return " ".join(str(text).split())


def _websockets() -> Any:
    try:
        import websockets.sync.client as client
    except ImportError as e:
        raise ImportError(
            f"OpenEnv servers need the 'websockets' package, which is not installed ({e}): {PACKAGE_HINT}"
        ) from None
    return client


# --- addresses and HTTP ----------------------------------------------------------------------------


def _urls(base_url: Any) -> tuple[str, str]:
    """``(http base, ws url)`` from an ``http(s)://`` or ``ws(s)://`` base URL (a path prefix kept)."""
    if not isinstance(base_url, str):
        raise TypeError(f"base_url must be a str (http://host:port), got {type(base_url).__name__}")
    parts = urllib.parse.urlsplit(base_url.strip())
    schemes = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"base_url must be an http(s):// or ws(s):// URL with a host, got {base_url!r}")
    try:
        parts.port
    except ValueError as e:
        raise ValueError(f"base_url {base_url!r}: {e}") from None
    path = parts.path.rstrip("/")
    ws = schemes[parts.scheme]
    http = {"ws": "http", "wss": "https"}[ws]
    return f"{http}://{parts.netloc}{path}", f"{ws}://{parts.netloc}{path}/ws"


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _get_json(http_base: str, route: str, timeout_s: float) -> Any:
    url = http_base + route
    handlers = [urllib.request.ProxyHandler({})] if _is_loopback(url) else []
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=timeout_s) as reply:
            body = reply.read()
    except urllib.error.HTTPError as e:
        raise ValueError(f"{http_base} is not an OpenEnv server (GET {route} answered HTTP {e.code})") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConnectionError(f"OpenEnv server at {http_base} is unreachable: {_line(reason)}") from None
    try:
        return json.loads(body)
    except ValueError:
        raise ValueError(f"{http_base} is not an OpenEnv server (GET {route} did not answer JSON)") from None


# --- the server's schema -> text fields ------------------------------------------------------------


def _json_types(prop: dict[str, Any]) -> set[str]:
    """The JSON types a schema property allows (``Optional[str]`` -> ``{"string", "null"}``)."""
    if "type" in prop:
        t = prop["type"]
        return set(t) if isinstance(t, list) else {t}
    return {x for alt in prop.get("anyOf", []) + prop.get("oneOf", []) for x in _json_types(alt)}


def _text_fields(schema: dict[str, Any], exclude: set[str]) -> list[str]:
    props = schema.get("properties", {})
    return [k for k, p in props.items() if k not in exclude and "string" in _json_types(p)]


@dataclass(frozen=True)
class ServerSpec:
    """How pcsd talks to one server: the resolved text fields (see the module docs)."""

    base_url: str  #: the http(s) base, without a trailing slash
    action_field: str
    observation_field: str
    task_field: str | None  #: ``None``: the task is the reset observation's text
    info_fields: tuple[str, ...]  #: observation fields passed through as info keys
    env_name: str  #: the Action class's title, for messages


def _resolve(
    http_base: str, schemas: Any, action_field: str | None, observation_field: str | None, task_field: str | None
) -> ServerSpec:
    if (
        not isinstance(schemas, dict)
        or not isinstance(schemas.get("action"), dict)
        or not isinstance(schemas.get("observation"), dict)
    ):
        raise ValueError(f"{http_base} is not an OpenEnv server (GET /schema has no action and observation schemas)")
    act, obs = schemas["action"], schemas["observation"]
    act_name, obs_name = act.get("title", "Action"), obs.get("title", "Observation")
    act_props = act.get("properties", {})
    required = [k for k in act.get("required", []) if k != "metadata"]
    texts = _text_fields(act, {"metadata"})
    where = f"OpenEnv server at {http_base}"
    if action_field is not None:
        if action_field not in texts:
            raise ValueError(
                f"action_field {action_field!r}: {act_name} has no text field of that name "
                f"(its text fields: {texts or 'none'})"
            )
    elif len(texts) == 1:
        action_field = texts[0]
    else:
        required_texts = [k for k in required if k in texts]
        if len(required_texts) != 1:
            fields = sorted(k for k in act_props if k != "metadata")
            if not texts:
                raise ValueError(
                    f"{where}: its action {act_name}({', '.join(fields)}) has no text field; pcsd "
                    "sends text actions and plays servers whose Action has one str field"
                )
            raise ValueError(
                f"{where}: its action {act_name} has several text fields {texts}; "
                "name the one pcsd fills with action_field="
            )
        action_field = required_texts[0]
    others = [k for k in required if k != action_field]
    if others:
        raise ValueError(
            f"{where}: its action {act_name} also requires {others}; pcsd sends text actions "
            "and plays servers whose Action needs only one str field"
        )

    obs_props = obs.get("properties", {})
    reserved = _OBS_RESERVED | set(INFO_FIELDS) | {"task"}
    obs_texts = _text_fields(obs, reserved)
    if observation_field is not None:
        if observation_field not in _text_fields(obs, _OBS_RESERVED):
            raise ValueError(
                f"observation_field {observation_field!r}: {obs_name} has no text field of that name "
                f"(its text fields: {obs_texts or 'none'})"
            )
    elif len(obs_texts) == 1:
        observation_field = obs_texts[0]
    elif not obs_texts:
        fields = sorted(k for k in obs_props if k not in _OBS_RESERVED)
        raise ValueError(
            f"{where}: its observation {obs_name}({', '.join(fields)}) has no text field; "
            "pcsd plays servers whose Observation has one str field"
        )
    else:
        raise ValueError(
            f"{where}: its observation {obs_name} has several text fields {obs_texts}; "
            "name the one pcsd reads with observation_field="
        )
    if task_field is not None:
        if task_field not in _text_fields(obs, _OBS_RESERVED):
            raise ValueError(f"task_field {task_field!r}: {obs_name} has no text field of that name")
    elif "task" in _text_fields(obs, _OBS_RESERVED):
        task_field = "task"
    info = tuple(k for k, t in INFO_FIELDS.items() if k in obs_props and t in _json_types(obs_props[k]))
    return ServerSpec(http_base, action_field, observation_field, task_field, info, act_name)


def inspect_server(
    base_url: str,
    *,
    action_field: str | None = None,
    observation_field: str | None = None,
    task_field: str | None = None,
    timeout_s: float = 10.0,
) -> ServerSpec:
    """Asks a running server for its health and schemas and resolves the text fields; raises one
    line (``ConnectionError``: unreachable; ``ValueError``: not OpenEnv, or types pcsd cannot map)."""
    http_base, _ = _urls(base_url)
    health = _get_json(http_base, "/health", timeout_s)
    if not isinstance(health, dict) or health.get("status") != "healthy":
        raise ConnectionError(f"OpenEnv server at {http_base} is not healthy (GET /health: {_line(health)})")
    return _resolve(http_base, _get_json(http_base, "/schema", timeout_s), action_field, observation_field, task_field)


def _app_spec(app: Any) -> tuple[str, str]:
    if not isinstance(app, str) or app.count(":") != 1 or not all(app.split(":")):
        raise ValueError(f"start must name an ASGI app as 'module:attribute' (e.g. 'my_env.server:app'), got {app!r}")
    module, attr = app.split(":")
    return module, attr


def check(
    base_url: str | None = None,
    *,
    start: str | None = None,
    app_dir: str | None = None,
    action_field: str | None = None,
    observation_field: str | None = None,
    task_field: str | None = None,
    timeout_s: float = 10.0,
) -> ServerSpec | None:
    """For config read. With ``base_url``: :func:`inspect_server` (the server must be up). With
    ``start``: the ``module:attribute`` form and that the module is found (without importing it:
    that is the server's work) -> ``None``. Raises one line as :class:`OpenEnvEnv` would."""
    _websockets()
    if (base_url is None) == (start is None):
        raise ValueError(
            "give exactly one of base_url (a running OpenEnv server) and start (module:attribute to serve)"
        )
    if base_url is not None:
        return inspect_server(
            base_url,
            action_field=action_field,
            observation_field=observation_field,
            task_field=task_field,
            timeout_s=timeout_s,
        )
    module, _ = _app_spec(start)
    path = [app_dir] if app_dir is not None else []
    sys.path[:0] = path
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        del sys.path[: len(path)]
    if not found:
        raise ValueError(
            f"start {start!r}: no module {module!r} in {app_dir or 'the current folder'} or the installed packages"
        )
    return None


# --- starting a server -----------------------------------------------------------------------------

# Run in the child: serve the app on the inherited listening socket; exit when the parent is gone.
_LAUNCHER = """
import os, socket, sys, threading, time
app, fd, parent = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
import uvicorn
uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)).run(sockets=[socket.socket(fileno=fd)])
"""


class OpenEnvServer:
    """An OpenEnv app (``module:attribute``) served by uvicorn in a child process on 127.0.0.1.

    ``start()`` binds a free port (or ``port``), launches the child with ``python`` (default: this
    interpreter), and waits until ``GET /health`` answers (``start_timeout_s``); a child that exits
    first raises one line with the last line of its log. ``stop()`` ends it (SIGTERM, then SIGKILL
    after 5 s). The child's output goes to a log file (``log_path``), removed on ``stop()``."""

    def __init__(
        self,
        app: str,
        *,
        app_dir: str | None = None,
        port: int = 0,
        python: str | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        _app_spec(app)
        self.app = app
        self.app_dir = app_dir
        self.port = port
        self.python = python or sys.executable
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: str | None = None
        self.base_url = ""

    def __repr__(self) -> str:
        return f"OpenEnvServer({self.app!r}, base_url={self.base_url!r})"

    def start(self) -> "OpenEnvServer":
        if self.process is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.port))
            sock.listen(128)
            port = sock.getsockname()[1]
            env = dict(os.environ)
            if self.app_dir is not None:
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (os.path.abspath(self.app_dir), env.get("PYTHONPATH")) if p
                )
            fd, self.log_path = tempfile.mkstemp(prefix="pcsd-openenv-", suffix=".log")
            with os.fdopen(fd, "wb") as log:
                self.process = subprocess.Popen(
                    [self.python, "-c", _LAUNCHER, self.app, str(sock.fileno()), str(os.getpid())],
                    pass_fds=(sock.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
        finally:
            sock.close()
        self.base_url = f"http://127.0.0.1:{port}"
        self._wait_ready()
        return self

    def _log_tail(self) -> str:
        try:
            with open(self.log_path or "", errors="replace") as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self._log_tail()
                self.stop()
                raise RuntimeError(
                    f"OpenEnv server {self.app!r} exited with code {code} before it was ready"
                    + (f": {tail}" if tail else "")
                )
            try:
                if _get_json(self.base_url, "/health", 2.0).get("status") == "healthy":
                    return
            except (ConnectionError, ValueError, AttributeError):
                pass
            if time.monotonic() > deadline:
                log = self.log_path
                self.stop()
                raise TimeoutError(
                    f"OpenEnv server {self.app!r} was not ready in {self.start_timeout_s:g} s "
                    f"(GET {self.base_url}/health; its log: {log})"
                )
            time.sleep(0.1)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.log_path is not None:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
            self.log_path = None

    def __enter__(self) -> "OpenEnvServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# The servers `OpenEnvEnv(start=...)` started in this process, shared by app: key -> [server, users].
_SERVERS: dict[tuple[str, str | None], list[Any]] = {}
_SERVERS_LOCK = threading.Lock()
_OWNER = os.getpid()


def _acquire(app: str, app_dir: str | None, start_timeout_s: float) -> OpenEnvServer:
    key = (app, app_dir and os.path.abspath(app_dir))
    with _SERVERS_LOCK:
        entry = _SERVERS.get(key)
        if entry is None or not entry[0].alive:
            entry = [OpenEnvServer(app, app_dir=app_dir, start_timeout_s=start_timeout_s).start(), 0]
            _SERVERS[key] = entry
        entry[1] += 1
        return entry[0]


def _release(server: OpenEnvServer) -> None:
    with _SERVERS_LOCK:
        for key, entry in list(_SERVERS.items()):
            if entry[0] is server:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _SERVERS[key]
                    server.stop()


@atexit.register
def _stop_all() -> None:
    if os.getpid() != _OWNER:  # a forked child does not own its parent's servers
        return
    with _SERVERS_LOCK:
        for server, _ in _SERVERS.values():
            server.stop()
        _SERVERS.clear()


# --- the env ---------------------------------------------------------------------------------------


class OpenEnvEnv:
    """One episode at a time on an OpenEnv server, in pcsd's text-env protocol (module docs).

    Exactly one of ``base_url`` (a running server) and ``start`` (``module:attribute`` to serve,
    shared by this process's envs with the same ``start``; ``app_dir`` is put first on its import
    path). ``action_field``/``observation_field``/``task_field``: the schema fields pcsd fills and
    reads, where the schema leaves a choice. ``connect_timeout_s``: opening the WebSocket;
    ``message_timeout_s``: each answer; ``start_timeout_s``: the started server's readiness.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        start: str | None = None,
        app_dir: str | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
        task_field: str | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
    ) -> None:
        self._client = _websockets()
        if (base_url is None) == (start is None):
            raise ValueError(
                "give exactly one of base_url (a running OpenEnv server) and start (module:attribute to serve)"
            )
        for name, v in (
            ("connect_timeout_s", connect_timeout_s),
            ("message_timeout_s", message_timeout_s),
            ("start_timeout_s", start_timeout_s),
        ):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {v!r}")
        self.server: OpenEnvServer | None = None
        if start is not None:
            self.server = _acquire(start, app_dir, start_timeout_s)
            base_url = self.server.base_url
        assert base_url is not None  # exactly one of base_url and start (checked above)
        try:
            self.spec = inspect_server(
                base_url,
                action_field=action_field,
                observation_field=observation_field,
                task_field=task_field,
                timeout_s=connect_timeout_s,
            )
        except BaseException:
            self._release_server()
            raise
        _, self._ws_url = _urls(self.spec.base_url)
        self._connect_timeout = float(connect_timeout_s)
        self._message_timeout = float(message_timeout_s)
        self._ws: Any = None
        self._live = False

    def __repr__(self) -> str:
        return f"OpenEnvEnv({self.spec.base_url!r}, env={self.spec.env_name!r})"

    # the session ---------------------------------------------------------------------------------

    def _connect(self) -> Any:
        if self._ws is None:
            try:
                # entered as a context manager (websockets >= 17 deprecates a bare connect()); _drop exits it
                self._ws = self._client.connect(
                    self._ws_url,
                    open_timeout=self._connect_timeout,
                    close_timeout=2,
                    max_size=100 * 2**20,
                    proxy=None if _is_loopback(self._ws_url) else True,
                ).__enter__()
            except Exception as e:
                raise ConnectionError(
                    f"OpenEnv server at {self.spec.base_url} is unreachable "
                    f"({self._ws_url}): {_line(e) or type(e).__name__}"
                ) from None
        return self._ws

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        self._live = False
        if ws is not None:
            try:
                ws.__exit__(None, None, None)  # closes the connection
            except Exception:
                pass

    def _call(self, message: dict[str, Any], what: str) -> dict[str, Any]:
        """One request and its answer's ``data``; raises one line. A server-side error answer is
        returned as ``{"__error__": data}`` for the caller to map."""
        from websockets.exceptions import ConnectionClosed

        ws = self._connect()
        try:
            try:
                ws.send(json.dumps(message))
            except ConnectionClosed:
                pass  # the server may have said why before closing: read it below
            raw = ws.recv(timeout=self._message_timeout)
        except TimeoutError:
            self._drop()
            raise TimeoutError(
                f"OpenEnv server at {self.spec.base_url} did not answer {what} in {self._message_timeout:g} s"
            ) from None
        except ConnectionClosed as e:
            self._drop()
            why = f"code {e.rcvd.code}" if e.rcvd is not None else "no close frame: the server is gone"
            raise ConnectionError(
                f"OpenEnv server at {self.spec.base_url} closed the connection during {what} ({why})"
            ) from None
        except OSError as e:
            self._drop()
            raise ConnectionError(f"OpenEnv server at {self.spec.base_url}: {what} failed: {_line(e)}") from None
        try:
            reply = json.loads(raw)
        except ValueError:
            self._drop()
            raise ValueError(f"OpenEnv server at {self.spec.base_url} answered {what} with non-JSON") from None
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, dict):
            self._drop()
            raise ValueError(f"OpenEnv server at {self.spec.base_url} answered {what} without data: {_line(raw)[:200]}")
        if reply.get("type") == "error":
            return {"__error__": data}
        return data

    def _raise_error(self, error: dict[str, Any], what: str) -> None:
        code = error.get("code")
        message = _line(error.get("message", "unknown error"))
        if code == "CAPACITY_REACHED":
            self._drop()
            raise RuntimeError(
                f"OpenEnv server at {self.spec.base_url} is full ({error.get('active_sessions')} of "
                f"{error.get('max_sessions')} sessions): serve it with create_app(..., max_concurrent_envs=N) for N "
                "envs, from an Environment with SUPPORTS_CONCURRENT_SESSIONS = True"
            )
        if code in ("SESSION_ERROR", "FACTORY_ERROR"):
            self._drop()
        raise RuntimeError(f"OpenEnv server at {self.spec.base_url}: {what} failed ({code}): {message}")

    def _observation(self, data: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        obs = data.get("observation")
        if not isinstance(obs, dict):
            raise ValueError(f"OpenEnv server at {self.spec.base_url} sent an observation that is not an object")
        text = obs.get(self.spec.observation_field)
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise TypeError(
                f"OpenEnv server at {self.spec.base_url}: observation field "
                f"{self.spec.observation_field!r} is not text (got {type(text).__name__})"
            )
        reward = data.get("reward")
        if reward is None:
            reward = 0.0
        if not isinstance(reward, (int, float)):
            raise TypeError(f"OpenEnv server at {self.spec.base_url}: reward is not a number (got {reward!r})")
        info = {k: obs[k] for k in self.spec.info_fields if obs.get(k) is not None}
        if self.spec.task_field is not None and obs.get(self.spec.task_field):
            info["task"] = obs[self.spec.task_field]
        return text, float(reward), bool(data.get("done", False)), info

    # the protocol ----------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A new episode on the server (a new session when the last one broke)."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
        data: dict[str, Any] = dict(options or {})
        if seed is not None:
            data["seed"] = seed
        reply = self._call({"type": "reset", "data": data}, "reset")
        if "__error__" in reply:
            self._raise_error(reply["__error__"], "reset")
        text, _, done, info = self._observation(reply)
        info.pop("won", None)  # an outcome: a step's key
        if text and not info.get("task"):
            info["task"] = text
        self._live = not done
        return text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        if not self._live:
            raise RuntimeError(
                f"OpenEnv server at {self.spec.base_url}: step() before reset() or after the "
                "episode ended; call reset()"
            )
        reply = self._call({"type": "step", "data": {self.spec.action_field: action}}, "step")
        if "__error__" in reply:
            error = reply["__error__"]
            if error.get("code") == "VALIDATION_ERROR":
                why = "; ".join(_line(e.get("msg", "")) for e in error.get("errors", []) if isinstance(e, dict))
                text = f"The environment rejected the action: {why or _line(error.get('message', ''))}"
                return text, 0.0, False, False, {"invalid_move": True}
            self._live = False
            self._raise_error(error, "step")
        text, reward, done, info = self._observation(reply)
        info.pop("task", None)
        info["invalid_move"] = False
        self._live = not done
        return text, reward, done, False, info

    def state(self) -> dict[str, Any]:
        """The server env's ``state`` (episode id, step count and the env's own fields)."""
        reply = self._call({"type": "state"}, "state")
        if "__error__" in reply:
            self._raise_error(reply["__error__"], "state")
        return reply

    def _release_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            _release(server)

    def close(self) -> None:
        """Ends the session (and the started server when this was its last env)."""
        if getattr(self, "_ws", None) is not None:
            try:
                self._ws.send(json.dumps({"type": "close"}))
            except Exception:
                pass
            self._drop()
        self._release_server()
