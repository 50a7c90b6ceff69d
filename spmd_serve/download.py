"""`download_model`: fetch a published static model (CONTRACT §7).

A published model is a tree of files under `<base>/<model_name>/<part>/`, listed with their md5 in
that folder's `file_list.txt` (one `relative/path:md5` a line).  `part` is `model` for a one-node
model, `node1`/`node2` for the master/slave halves of a two-node model and `mtp` for a speculative
draft model.  `<base>` is `$MODEL_BASE_URL`, by default the original tool's published location
`https://paddlenlp.bj.bcebos.com/models/static/<tag>` with `$tag` defaulting to `3.0.0.b4`.

Every file is written as `<path>.part` and renamed only after its md5 matched, so a reader never
sees half a file; an existing `.part` is resumed with an HTTP Range request (the server may answer
200 instead, then it starts over).  While a download into a folder is unfinished that folder holds
a `.downloading` marker, which is how `start_server` tells "there" from "half there".
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import requests

DEFAULT_TAG = "3.0.0.b4"
DEFAULT_BASE = "https://paddlenlp.bj.bcebos.com/models/static/{tag}"
INCOMPLETE_MARKER = ".downloading"
_MD5 = re.compile(r"[0-9a-fA-F]{32}")
_CHUNK = 1 << 20  # md5 reads
# urllib3 gathers a whole chunk before handing it over and drops it if the connection breaks
# meanwhile, so the network chunk bounds what a drop loses (resume restarts at the last write).
_NET_CHUNK = 64 << 10
_ATTEMPTS = 5  # per file: connection drops are resumed this many times
_TIMEOUT = (10, 60)  # (connect, read) seconds; a stalled read counts as a drop


class DownloadError(Exception):
    """A download failed; the message names the file and the URL."""


@dataclass(frozen=True)
class Entry:
    """One line of file_list.txt."""

    path: str  # relative POSIX path inside the model folder
    md5: str


def base_url(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return (env.get("MODEL_BASE_URL") or DEFAULT_BASE.format(tag=env.get("tag") or DEFAULT_TAG)).rstrip("/")


def part_name(nnodes: int, mode: str) -> str:
    """Which published folder a node fetches (the original tool's rule: any multi-node model is
    split in a master half `node1` and a slave half `node2`)."""
    if nnodes < 1:
        raise DownloadError(f"--nnodes {nnodes} is invalid: must be >= 1")
    if nnodes == 1:
        return "model"
    return {"master": "node1", "slave": "node2"}[mode]


def is_complete(folder: Path) -> bool:
    """A model folder is usable when it has a config.json and no unfinished download."""
    return (folder / "config.json").is_file() and not (folder / INCOMPLETE_MARKER).exists()


def _safe_relpath(path: str, where: str) -> str:
    # A file list must never write outside the model folder ("../x", "/etc/x").
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts:
        raise DownloadError(f"{where}: refusing unsafe path {path!r}")
    return str(p)


def parse_file_list(text: str, url: str) -> list[Entry]:
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        path, sep, md5 = line.rpartition(":")
        if not sep or not _MD5.fullmatch(md5.strip()):
            raise DownloadError(f"{url} line {n}: expected 'path:md5', got {line!r}")
        entries.append(Entry(_safe_relpath(path.strip(), f"{url} line {n}"), md5.strip().lower()))
    if not entries:
        raise DownloadError(f"{url} lists no files")
    return entries


def fetch_file_list(session: requests.Session, folder_url: str, model_name: str) -> list[Entry]:
    url = f"{folder_url}/file_list.txt"
    try:
        res = session.get(url, timeout=_TIMEOUT)
    except requests.RequestException as e:
        raise DownloadError(f"cannot reach {url}: {e}") from None
    if res.status_code in (403, 404):
        raise DownloadError(
            f"model {model_name!r} is not published at {url} (HTTP {res.status_code}): "
            "unknown model name? check the name, $tag and $MODEL_BASE_URL"
        )
    if res.status_code != 200:
        raise DownloadError(f"cannot fetch {url}: HTTP {res.status_code}")
    return parse_file_list(res.text, url)


def md5_of(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class Progress:
    """A one-line progress bar on stderr; on a non-terminal only the start and end lines, so
    logs stay readable."""

    def __init__(self, label: str, total: int | None, done: int) -> None:
        self.label, self.total, self.done = label, total, done
        self.tty = sys.stderr.isatty()
        self.t0, self.start_bytes, self.last = time.monotonic(), done, 0.0
        if not self.tty:
            resumed = f" (resuming at {done / 2**20:.1f} MiB)" if done else ""
            print(f"downloading {label}{resumed}", file=sys.stderr, flush=True)

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.tty and now - self.last >= 0.1:
            self.last = now
            self._draw("\r")

    def _draw(self, end: str) -> None:
        rate = (self.done - self.start_bytes) / max(time.monotonic() - self.t0, 1e-6) / 2**20
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            text = f"{self.label} [{bar:<30}] {frac:4.0%} {self.done / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
        else:
            text = f"{self.label} {self.done / 2**20:.1f} MiB"
        print(f"\r{text} {rate:.1f} MiB/s", end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        self._draw("\n") if self.tty else print(f"done {self.label}", file=sys.stderr, flush=True)


def _fetch_part(session: requests.Session, url: str, part: Path, label: str) -> None:
    """Bring `part` to the full length of `url`, resuming from its current size."""
    for attempt in range(1, _ATTEMPTS + 1):
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with session.get(url, headers=headers, stream=True, timeout=_TIMEOUT) as res:
                if res.status_code == 416:  # nothing past `have`: the part is already whole
                    return
                if res.status_code not in (200, 206):
                    raise DownloadError(f"cannot fetch {label} from {url}: HTTP {res.status_code}")
                if res.status_code == 200:  # the server ignored the Range: start over
                    have = 0
                length = res.headers.get("Content-Length")
                total = have + int(length) if length and length.isdigit() else None
                bar = Progress(label, total, have)
                with open(part, "ab" if have else "wb") as f:
                    for chunk in res.iter_content(_NET_CHUNK):
                        f.write(chunk)
                        bar.update(len(chunk))
                    f.flush()
                    os.fsync(f.fileno())
                bar.close()
                if total is not None and part.stat().st_size < total:
                    raise requests.ConnectionError(f"connection closed at {part.stat().st_size} of {total} bytes")
                return
        except requests.RequestException as e:
            if attempt == _ATTEMPTS:
                raise DownloadError(f"cannot fetch {label} from {url} after {attempt} attempts: {e}") from None
            print(f"\n{label}: {e}; resuming (attempt {attempt + 1}/{_ATTEMPTS})", file=sys.stderr, flush=True)
            time.sleep(min(2 ** (attempt - 1), 10))


def download_file(session: requests.Session, url: str, dest: Path, md5: str) -> bool:
    """Download one file unless it is already there with the right md5; True if fetched."""
    if dest.is_file() and md5_of(dest) == md5:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    for fresh in (False, True):
        resumed = part.exists() and part.stat().st_size > 0
        _fetch_part(session, url, part, str(dest))
        got = md5_of(part)
        if got == md5:
            os.replace(part, dest)  # atomic: the final name appears only with verified content
            return True
        part.unlink()
        if fresh or not resumed:  # a resumed file may be stale; a fresh one is really wrong
            break
    raise DownloadError(
        f"md5 mismatch for {dest} downloaded from {url}: expected {md5}, got {got} "
        "(corrupted download or a changed file list; run again)"
    )


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """One downloader per folder at a time (several ranks of one node may ask together)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".download.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def download_tree(folder_url: str, dest: Path, model_name: str) -> int:
    """Fetch every file listed under `folder_url` into `dest`; returns how many were fetched."""
    with _folder_lock(dest), requests.Session() as session:
        entries = fetch_file_list(session, folder_url, model_name)
        marker = dest / INCOMPLETE_MARKER
        marker.write_text(f"{folder_url}\n")
        print(f"{len(entries)} files from {folder_url} into {dest}", file=sys.stderr, flush=True)
        fetched = sum(download_file(session, f"{folder_url}/{e.path}", dest / e.path, e.md5) for e in entries)
        marker.unlink()
    return fetched


def download_model(
    model_name: str,
    directory: Path,
    nnodes: int = 1,
    mode: str = "master",
    speculate_model_path: Path | None = None,
    base: str | None = None,
) -> Path:
    """Download `model_name` into `directory/model_name` (and its draft model into
    `speculate_model_path`); returns the model folder."""
    name = _safe_relpath(model_name.strip("/"), "--model_name")
    root = (base or base_url()).rstrip("/") + f"/{name}"
    dest = directory / name
    download_tree(f"{root}/{part_name(nnodes, mode)}", dest, model_name)
    if speculate_model_path is not None:
        download_tree(f"{root}/mtp", speculate_model_path, model_name)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="download_model",
        description=__doc__.splitlines()[0],
        epilog=f"Base URL: $MODEL_BASE_URL, default {DEFAULT_BASE} with $tag (default {DEFAULT_TAG}).",
    )
    ap.add_argument("-m", "--model_name", required=True, help="published model name, e.g. org/model/weight_only_int8")
    ap.add_argument("-d", "--dir", default="downloads", type=Path, help="the model goes to DIR/<model_name>")
    ap.add_argument("-n", "--nnodes", type=int, default=1, help="number of nodes the model is split over")
    ap.add_argument(
        "-M",
        "--mode",
        default="master",
        choices=("master", "slave"),
        help="with --nnodes > 1: which node's half to fetch",
    )
    ap.add_argument(
        "-s",
        "--speculate_model_path",
        type=Path,
        default=None,
        help="also fetch the speculative (mtp) draft model into this folder",
    )
    args = ap.parse_args(argv)
    try:
        dest = download_model(args.model_name, args.dir, args.nnodes, args.mode, args.speculate_model_path)
    except DownloadError as e:
        print(f"download_model: error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("\ndownload_model: interrupted; run again to resume", file=sys.stderr)
        return 130
    print(f"{args.model_name} is in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
