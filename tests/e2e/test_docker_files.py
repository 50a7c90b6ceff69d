"""The Docker images without a Docker engine (issue 4, "Must show"): both Dockerfiles lint clean
with hadolint, every shell script of the repository with shellcheck (both linters come from PyPI
with the test extras, so these tests never skip), everything the Dockerfiles COPY exists and is
in the build context, the base images / Paddle index match the CUDA stack each file promises, the
exposed ports are CONTRACT §2's defaults, and the entrypoint runs `start_server` and stops cleanly
on SIGTERM (run here on the host, as the container would run it)."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from spmd_serve.envs import BY_NAME
from tests.support.launcher_process import launcher_env, port_is_free, processes_of
from tests.support.server_process import VENV_BIN, kill_session

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cuda12.4": ROOT / "docker" / "Dockerfile.cuda12.4", "cuda11.8": ROOT / "docker" / "Dockerfile.cuda11.8"}
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def tool(name: str) -> str:
    path = shutil.which(name, path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert path, f"{name} not found: install the test extras (pip install -e .[test] / make install-test)"
    return path


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#"))
    )
    return [
        (m.group(1).upper(), m.group(2).strip())
        for m in (re.match(r"\s*([A-Za-z]+)\s+(.*)", ln) for ln in text.splitlines())
        if m
    ]


def dockerignore_patterns() -> list[str]:
    return [
        ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]


def ignored(rel: str, patterns: list[str]) -> bool:
    parts = Path(rel).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(
        fnmatch.fnmatch(p, pat.removeprefix("**/")) or fnmatch.fnmatch(p, pat)
        for pat in patterns
        for p in prefixes + list(parts)
    )


def shell_scripts() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.sh"], cwd=ROOT, capture_output=True, text=True)
    tracked = [ROOT / p for p in out.stdout.split()] if out.returncode == 0 else []
    found = set(tracked) | set(ROOT.glob("docker/*.sh")) | set(ROOT.glob("launch/*.sh")) | set(ROOT.glob(".ci/*"))
    return sorted(
        p for p in found if p.is_file() and p.read_text().startswith("#!") and "sh" in p.read_text().split("\n")[0]
    )


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name):
    res = subprocess.run([tool("hadolint"), "--no-color", str(DOCKERFILES[name])], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_shellcheck_passes_on_every_shell_script(tmp_path):
    from tests.support.netns import AGENT

    agent = tmp_path / "netns_agent.sh"  # the tests' generated launch agent, rendered
    agent.write_text(AGENT.replace("{cases}", "  10.0.0.1) ns=a ;;"))
    scripts = [*shell_scripts(), agent]
    assert {"entrypoint.sh", "install.sh", "run_tests.sh", "serve_demo.sh"} <= {p.name for p in scripts}
    res = subprocess.run([tool("shellcheck"), *map(str, scripts)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_everything_copied_exists_in_the_build_context(name):
    patterns = dockerignore_patterns()
    copies = [args for ins, args in instructions(DOCKERFILES[name]) if ins in ("COPY", "ADD")]
    assert copies
    for args in copies:
        words = [w for w in args.split() if not w.startswith("--")]
        assert not args.startswith("--from"), args
        for src in words[:-1]:
            assert (ROOT / src).exists(), f"{name}: COPY source {src} missing"
            assert not ignored(src.rstrip("/"), patterns), f"{name}: {src} is excluded by .dockerignore"
    # setup.cfg reads README.md and the version from spmd_serve/: both must reach the image
    assert all(not ignored(p, patterns) for p in ("README.md", "setup.cfg", "spmd_serve/__init__.py", "ops/nvrtc.py"))


@pytest.mark.parametrize(
    "name, base, index",
    [
        ("cuda12.4", "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", "/packages/stable/cu126/"),
        ("cuda11.8", "nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04", "/packages/stable/cu118/"),
    ],
)
def test_cuda_stack_python_and_mpi(name, base, index):
    ins = instructions(DOCKERFILES[name])
    assert ("FROM", base) in ins
    text = " ".join(a for _, a in ins)
    assert index in text and "paddlepaddle-gpu==" in text
    assert "python3.11" in text and "openmpi-bin" in text and "cuda-python[all]" in text
    assert "docker/install.sh project" in text


@pytest.mark.parametrize("name", DOCKERFILES)
def test_exposed_ports_and_entrypoint_match_the_contract(name):
    ins = instructions(DOCKERFILES[name])
    exposed = {int(p) for ins_, a in ins if ins_ == "EXPOSE" for p in a.split()}
    public = {
        BY_NAME[v].default for v in ("SERVICE_HTTP_PORT", "SERVICE_GRPC_PORT", "HEALTH_HTTP_PORT", "METRICS_HTTP_PORT")
    }
    assert exposed == public == {9965, 8811, 8110, 8722}
    assert BY_NAME["INTER_PROC_PORT"].default not in exposed  # loopback only
    entry = [a for i, a in ins if i == "ENTRYPOINT"]
    assert entry == ['["/usr/bin/tini", "--", "spmd_serve_entrypoint"]']
    assert any(i == "RUN" and "docker/entrypoint.sh /usr/local/bin/spmd_serve_entrypoint" in a for i, a in ins)
    assert re.search(r"^start_server \"\$@\"", ENTRYPOINT.read_text(), re.M)
    readme = (ROOT / "docker" / "README.md").read_text()
    for flag in (
        "--gpus all",
        "--shm-size 8g",
        "-p 9965:9965",
        "-p 8811:8811",
        "-p 8110:8110",
        "-p 8722:8722",
        ":/models",
        "-e model_name=",
    ):
        assert flag in readme


def test_entrypoint_runs_another_command_when_given_one():
    res = subprocess.run(["bash", str(ENTRYPOINT), "echo", "hello"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and res.stdout == "hello\n"


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_entrypoint_serves_then_stops_on_sigterm(served_tp1, tmp_path):
    """What `docker run` then `docker stop` do, on the host: the entrypoint starts the server, stays
    in the foreground while it runs, and SIGTERM drains it; exit 0, nothing left behind."""
    log_dir = tmp_path / "log"
    env = launcher_env(log_dir, MODEL_DIR=str(served_tp1), MP_NUM="1", STOP_TIMEOUT="20")
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    proc = subprocess.Popen(
        ["bash", str(ENTRYPOINT)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{env['HEALTH_HTTP_PORT']}/v2/health/ready"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if requests.get(url, timeout=1).status_code == 200 and (log_dir / "server.pid").exists():
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(3)  # start_server has returned; still in the foreground
        assert proc.poll() is None
        res = requests.post(
            f"http://127.0.0.1:{env['SERVICE_HTTP_PORT']}/v1/chat/completions",
            json={"text": "Hello, how are you?", "max_dec_len": 8},
            timeout=60,
        )
        assert res.status_code == 200 and res.json()["error_code"] == 0
        os.kill(proc.pid, signal.SIGTERM)  # docker stop
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, out
        assert "spmd_serve is ready" in out  # start_server's report,
        assert "POST /v1/chat/completions" in out  # then server.log, followed
        assert "gracefully" in out  # stop_server's report
        assert not (log_dir / "server.pid").exists()
        assert processes_of(log_dir) == []
        assert all(port_is_free(int(env[v])) for v in ("SERVICE_HTTP_PORT", "HEALTH_HTTP_PORT"))
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
            proc.wait(10)
        for p in processes_of(log_dir):
            p.kill()


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_serve_on_the_cpu_until_the_gpu_runner_exists(name):
    """The images install paddlepaddle-gpu, with which SPMD_DEVICE=auto picks the GPU runner, which is
    not built and refuses (docs/gpu.md): they set SPMD_DEVICE=cpu, and their README says the CPU serves."""
    env = " ".join(a for i, a in instructions(DOCKERFILES[name]) if i == "ENV")
    assert re.search(r"(^|\s)SPMD_DEVICE=cpu(\s|$)", env), env
    assert "runs on the CPU" in (ROOT / "docker" / "README.md").read_text()
