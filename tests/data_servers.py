"""Local HTTP servers on 127.0.0.1 for the tests of ``pcsd.data`` (nothing leaves the machine).

:class:`FileServer` serves named byte strings with ``Range`` support and faults on demand: a file
cut mid-way the first N times it is asked for (then served whole, from the asked range), a 404.
:class:`FakeHub` serves a model folder through the few Hugging Face Hub endpoints that
``huggingface_hub.snapshot_download`` / ``hf_hub_download`` / ``HfApi.list_repo_tree`` use
(``/api/models/<id>/revision/<rev>``, ``/api/models/<id>/tree/<rev>``, ``/<id>/resolve/<rev>/<file>``),
so the real library downloads from it. Both log every request (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlparse


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send_bytes(
        self,
        data: bytes,
        *,
        head: bool = False,
        cut_at: Optional[int] = None,
        headers: Optional[dict] = None,
        ctype: str = "application/octet-stream",
    ) -> None:
        rng = self.headers.get("Range")
        start = 0
        if rng and rng.startswith("bytes=") and self.server.ranges:  # type: ignore[attr-defined]
            start = int(rng[6:].split("-")[0])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        if cut_at is not None:
            self.wfile.write(body[:cut_at])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)

    def _json(self, obj, status: int = 200, headers: Optional[dict] = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _not_found(self, headers: Optional[dict] = None) -> None:
        self._json({"error": "not found"}, 404, headers)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Running:
    def __init__(self, handler) -> None:
        self.log: list[tuple[str, str, Optional[str]]] = []
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.httpd.ranges = True  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FileServer(_Running):
    """Serves ``files`` (name -> bytes) at ``<url>/<name>``; ``cut[name] = (times, at)`` cuts the
    first ``times`` responses of ``name`` after ``at`` bytes; ``html`` names files answered as a
    text/html page."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)
        self.cut: dict[str, tuple[int, int]] = {}
        self.html: set[str] = set()

        class H(_Base):
            def do_GET(self) -> None:
                owner: FileServer = self.server.owner  # type: ignore[attr-defined]
                name = unquote(urlparse(self.path).path.lstrip("/"))
                owner.log.append(("GET", name, self.headers.get("Range")))
                if name not in owner.files:
                    self._not_found()
                    return
                cut_at = None
                times, at = owner.cut.get(name, (0, 0))
                if times > 0:
                    owner.cut[name] = (times - 1, at)
                    cut_at = at
                ctype = "text/html; charset=utf-8" if name in owner.html else "application/octet-stream"
                self._send_bytes(owner.files[name], cut_at=cut_at, ctype=ctype)

        super().__init__(H)

    def ranges(self, on: bool) -> None:
        self.httpd.ranges = on  # type: ignore[attr-defined]


class FakeHub(_Running):
    """A Hub serving model repos: ``repos[id] = folder``; every file of the folder is in the repo,
    ``*.safetensors`` as LFS files (their SHA-256 published in the tree listing).
    ``corrupt[(id, file)] = bytes`` serves other bytes than those the listing's checksum is of."""

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = dict(repos)
        self.corrupt: dict[tuple[str, str], bytes] = {}

        class H(_Base):
            def do_HEAD(self) -> None:
                self._route(head=True)

            def do_GET(self) -> None:
                self._route(head=False)

            def _route(self, head: bool) -> None:
                owner: FakeHub = self.server.owner  # type: ignore[attr-defined]
                path = unquote(urlparse(self.path).path)
                owner.log.append(("HEAD" if head else "GET", path, self.headers.get("Range")))
                for repo, folder in owner.repos.items():
                    api = f"/api/models/{repo}/"
                    if path.startswith(api + "revision/"):
                        files = owner.files(repo)
                        self._json(
                            {
                                "id": repo,
                                "modelId": repo,
                                "sha": owner.COMMIT,
                                "private": False,
                                "siblings": [{"rfilename": f} for f in files],
                            }
                        )
                        return
                    if path.startswith(api + "tree/"):
                        self._json([owner.entry(repo, f) for f in owner.files(repo)])
                        return
                    pre = f"/{repo}/resolve/"
                    if path.startswith(pre):
                        name = path[len(pre) :].split("/", 1)[1]
                        if name not in owner.files(repo):
                            self._not_found({"X-Error-Code": "EntryNotFound", "X-Repo-Commit": owner.COMMIT})
                            return
                        data = (folder / name).read_bytes()
                        e = owner.entry(repo, name)
                        etag = e["lfs"]["oid"] if "lfs" in e else e["oid"]
                        hdr = {"X-Repo-Commit": owner.COMMIT, "ETag": f'"{etag}"'}
                        if "lfs" in e:
                            hdr["X-Linked-Etag"] = f'"{etag}"'
                            hdr["X-Linked-Size"] = str(len(data))
                        self._send_bytes(owner.corrupt.get((repo, name), data), head=head, headers=hdr)
                        return
                self._not_found({"X-Error-Code": "RepoNotFound"})

        super().__init__(H)

    def files(self, repo: str) -> list[str]:
        folder = self.repos[repo]
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())

    def entry(self, repo: str, name: str) -> dict:
        data = (self.repos[repo] / name).read_bytes()
        git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        e = {"type": "file", "oid": git, "size": len(data), "path": name}
        if name.endswith(".safetensors"):
            e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return e
