"""Build llama.cpp's `llama-server` from the llama-cpp-python sdist on PyPI, once, into a cache dir.

This module owns where the peer server comes from: `pip download --no-binary llama-cpp-python
--no-deps llama-cpp-python==V` (the sdist vendors llama.cpp, its `gguf-py` and its converters), unpacked
under `$SPMD_SERVE_CACHE/peers/` (default `~/.cache/spmd_serve/peers/`), configured with cmake for
the CPU only (native arch) and with every option that would fetch something at build time turned
off (prebuilt web UI from a model hub, BoringSSL/LibreSSL, OpenSSL, kleidiai, llguidance), and
built for the targets the comparison runs.  A stamp file written after a successful build makes a
second call free; a half-finished build is resumed by cmake's own incremental build.

    python -m benchmarks.peers.build_llama [--version 0.3.36|latest]

Not run in CI: a developer runs it (or `benchmarks.peers.compare`, which calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

# The sdist the figures in benchmarks/RESULTS.md were measured with; "latest" asks PyPI.
DEFAULT_VERSION = "0.3.36"
TARGETS = ("llama-server", "llama-tokenize")
# CPU only, native arch, static binaries, and nothing that downloads at configure/build time.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_CUDA=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_METAL=OFF",
    "-DGGML_RPC=OFF",
    "-DGGML_CPU_KLEIDIAI=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    # The web UI is fetched from a model hub unless both are off (the server then has no UI page).
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_BORINGSSL=OFF",
    "-DLLAMA_BUILD_LIBRESSL=OFF",
    "-DLLAMA_LLGUIDANCE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",  # belt and braces: any FetchContent left fails
    # AMX: this VM's CPU lists amx_tile/amx_int8 but Q8_0's AMX path dies of SIGILL at start-up
    # (2026-11-27: the state is not enabled for guests); the AVX-512 VNNI kernels run instead
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
)
STAMP = "spmd_serve_build.json"


@dataclass(frozen=True)
class LlamaCpp:
    """A built llama.cpp: its binaries, its Python packages and what it is."""

    sdist_version: str  # llama-cpp-python's version
    commit: str  # the llama.cpp commit the sdist vendors (from its CHANGELOG), or "unknown"
    src: Path  # vendor/llama.cpp

    @property
    def bin_dir(self) -> Path:
        return self.src / "build" / "bin"

    @property
    def server(self) -> Path:
        return self.bin_dir / "llama-server"

    @property
    def tokenize(self) -> Path:
        return self.bin_dir / "llama-tokenize"

    @property
    def gguf_py(self) -> Path:
        return self.src / "gguf-py"

    def describe(self) -> str:
        return f"llama-cpp-python {self.sdist_version} sdist (vendors llama.cpp {self.commit})"


def cache_root() -> Path:
    """Outside the repo, next to the demo exports (the same variable export.py honours)."""
    return Path(os.environ.get("SPMD_SERVE_CACHE", Path.home() / ".cache" / "spmd_serve")) / "peers"


def vendored_commit(changelog: str, version: str) -> str:
    """The llama.cpp commit in the CHANGELOG section of `version` ("feat: update llama.cpp to
    ggml-org/llama.cpp@<sha>"; the first such line is the newest), or "unknown"."""
    section = re.search(rf"^## \[{re.escape(version)}\]\s*$(.*?)(?=^## \[|\Z)", changelog, re.M | re.S)
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section.group(1)) if section else None
    return found.group(1) if found else "unknown"


def download_sdist(version: str, dest: Path) -> Path:
    """`pip download` the sdist (never a wheel) into `dest`; returns the .tar.gz."""
    spec = "llama-cpp-python" if version == "latest" else f"llama-cpp-python=={version}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            # the sdist alone: `:all:` would also build pip's metadata step's build backend and its
            # dependencies from source (cmake included: tens of minutes on two cores)
            "--no-binary",
            "llama-cpp-python",
            "--no-deps",
            "--quiet",
            "-d",
            str(dest),
            spec,
        ],
        check=True,
    )
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download left no llama_cpp_python-*.tar.gz in {dest}")
    return found[-1]


def unpack(sdist: Path, root: Path) -> Path:
    """Extract the sdist under `root` (atomically: a temp dir renamed); returns its top dir."""
    name = sdist.name.removesuffix(".tar.gz")
    top = root / name
    if (top / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        return top
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        shutil.rmtree(top, ignore_errors=True)
        os.replace(tmp / name, top)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return top


def _find_unpacked(root: Path, version: str) -> Path | None:
    if version == "latest":
        return None
    top = root / f"llama_cpp_python-{version}"
    return top if (top / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file() else None


def build(src: Path, commit: str, jobs: int) -> None:
    """Configure and build TARGETS in src/build (incremental: a rerun only finishes what is left;
    configured every time, so changed CMAKE_FLAGS reach an existing build)."""
    bdir = src / "build"
    # LLAMA_BUILD_COMMIT: the sdist has no .git, so the server would report "unknown".
    subprocess.run(
        ["cmake", "-S", str(src), "-B", str(bdir), *CMAKE_FLAGS, f"-DLLAMA_BUILD_COMMIT={commit}"], check=True
    )
    subprocess.run(
        ["nice", "-n", "10", "cmake", "--build", str(bdir), "-j", str(jobs), "--target", *TARGETS], check=True
    )


def ensure_llama_cpp(version: str = DEFAULT_VERSION, jobs: int | None = None) -> LlamaCpp:
    """The built llama.cpp of llama-cpp-python `version`: downloaded, unpacked and built if needed."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    top = _find_unpacked(root, version)
    if top is None:
        with tempfile.TemporaryDirectory(dir=root) as dl:
            top = unpack(download_sdist(version, Path(dl)), root)
    sdist_version = top.name.removeprefix("llama_cpp_python-")
    commit = vendored_commit((top / "CHANGELOG.md").read_text(encoding="utf-8"), sdist_version)
    lc = LlamaCpp(sdist_version, commit, top / "vendor" / "llama.cpp")
    stamp = lc.src / "build" / STAMP
    want = {"sdist": sdist_version, "commit": commit, "flags": list(CMAKE_FLAGS), "targets": list(TARGETS)}
    if stamp.is_file() and json.loads(stamp.read_text()) == want and all((lc.bin_dir / t).is_file() for t in TARGETS):
        return lc
    build(lc.src, commit, jobs or os.cpu_count() or 1)
    stamp.write_text(json.dumps(want, indent=1))
    return lc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default=DEFAULT_VERSION, help="llama-cpp-python sdist version, or latest")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    args = ap.parse_args(argv)
    lc = ensure_llama_cpp(args.version, args.jobs)
    print(f"{lc.server}\n{lc.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
