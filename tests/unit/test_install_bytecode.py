"""launch/install.sh leaves bytecode for what it installed: uv writes none, and where
PYTHONDONTWRITEBYTECODE is set (this machine, CI) or site-packages is read-only, every rank, HTTP
worker, export and test process would compile Paddle's and PaddleNLP's modules from source, ~10 s of
CPU each (benchmarks/RESULTS.md "Session 37")."""

from __future__ import annotations

import importlib.util
import struct
import sysconfig
from pathlib import Path

# what a rank and an HTTP worker import most of
PACKAGES = ("paddle", "paddlenlp", "numpy", "tornado", "grpc")


def _stale_or_missing(src: Path) -> bool:
    """Would the interpreter compile `src` again: no cached file, or one it would not trust (the
    default timestamp-checked .pyc: magic, flags 0, the source's mtime and size)."""
    try:
        head = Path(importlib.util.cache_from_source(str(src))).read_bytes()[:16]
    except OSError:
        return True
    if len(head) < 16 or head[:4] != importlib.util.MAGIC_NUMBER:
        return True
    flags, mtime, size = struct.unpack("<III", head[4:16])
    st = src.stat()
    return flags != 0 or mtime != int(st.st_mtime) & 0xFFFFFFFF or size != st.st_size & 0xFFFFFFFF


def test_the_servers_packages_are_installed_with_their_bytecode():
    purelib = Path(sysconfig.get_paths()["purelib"])
    sources = [src for pkg in PACKAGES for src in (purelib / pkg).rglob("*.py")]
    assert len(sources) > 1000, f"the packages were not found under {purelib}"
    stale = [str(src.relative_to(purelib)) for src in sources if _stale_or_missing(src)]
    assert not stale, f"{len(stale)} of {len(sources)} modules without current bytecode, e.g. {stale[:5]}"
