#!/usr/bin/env bash
# Python packages of the Docker images, into the active venv ($VIRTUAL_ENV), run from the
# repository copy in the image:
#   docker/install.sh deps PADDLE_REQ PADDLE_INDEX CUDA_PYTHON_REQ
#       GPU Paddle from Paddle's index, then every other requirement of setup.cfg from PyPI, with
#       setup.cfg's CPU `paddlepaddle` left out (both provide the `paddle` module) and its
#       `cuda-python` replaced by CUDA_PYTHON_REQ.
#   docker/install.sh project
#       spmd_serve itself (no dependencies: they are in place), console scripts included.
set -euo pipefail
cd "$(dirname "$0")/.."
pip=(python -m pip install --no-cache-dir)

case "${1:-}" in
  deps)
    [ $# -eq 4 ] || { echo "usage: $0 deps PADDLE_REQ PADDLE_INDEX CUDA_PYTHON_REQ" >&2; exit 2; }
    paddle_req="$2" paddle_index="$3" cuda_python_req="$4"
    "${pip[@]}" --upgrade pip
    "${pip[@]}" "$paddle_req" -i "$paddle_index" --extra-index-url https://pypi.org/simple
    mapfile -t reqs < <(python - "$cuda_python_req" <<'PY'
import configparser, re, sys
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
for req in cfg["options"]["install_requires"].split("\n"):
    req = req.strip()
    name = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower()
    if not req or name == "paddlepaddle":
        continue
    print(sys.argv[1] if name == "cuda-python" else req)
PY
)
    "${pip[@]}" "${reqs[@]}"
    ;;
  project)
    "${pip[@]}" --no-deps .
    python -c "import paddle, mpi4py, spmd_serve; print('paddle', paddle.__version__, 'cuda', paddle.version.cuda())"
    ;;
  *)
    echo "usage: $0 deps PADDLE_REQ PADDLE_INDEX CUDA_PYTHON_REQ | project" >&2
    exit 2
    ;;
esac
