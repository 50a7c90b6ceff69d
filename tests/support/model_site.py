"""A published model tree on a loopback HTTP server, as `download_model` meets the original bucket
(test helper): `<root>/<name>/model/` with its `file_list.txt` of `path:md5` lines."""

from __future__ import annotations

import hashlib
import http.server
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RANGE = re.compile(r"bytes=(\d+)-$")


class ModelSite(http.server.ThreadingHTTPServer):
    """Serves `root` like the bucket: GET with `Range: bytes=N-`, a one-shot connection drop after
    `drop[path]` bytes, and a log of (path, Range header) for the assertions."""

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.drop, self.requests = root, {}, []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ModelSite

    def log_message(self, *_args) -> None:  # keep the test output clean
        pass

    def do_GET(self) -> None:
        rel = self.path.lstrip("/")
        self.server.requests.append((rel, self.headers.get("Range")))
        path = self.server.root / rel
        if ".." in rel or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = 0
        m = RANGE.match(self.headers.get("Range") or "")
        if m:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = self.server.drop.pop(rel, None)
        self.wfile.write(body if cut is None else body[:cut])
        if cut is not None:
            self.close_connection = True  # the client sees a short body: a dropped connection


def publish(model_dir: Path, root: Path, name: str) -> dict[str, str]:
    """Lay `model_dir` out as `<root>/<name>/model/` with its file_list.txt; returns path -> md5."""
    folder = root / name / "model"
    shutil.copytree(model_dir, folder)
    md5 = {
        p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    (folder / "file_list.txt").write_text("".join(f"{k}:{v}\n" for k, v in md5.items()))
    return md5


@contextmanager
def serving(root: Path) -> Iterator[ModelSite]:
    """A ModelSite over `root`, on a thread, shut down on exit."""
    server = ModelSite(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
