"""`download_model` against a published model tree on a loopback HTTP server (CONTRACT §7): full
download, resume after a dropped connection and from a leftover `.part`, md5 mismatch caught, an
unknown model refused; then `start_server <model_name>` serves what was downloaded."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import requests

from tests.support.launcher_process import always_stopped, launcher_env, processes_of, run
from tests.support.model_site import RANGE, ModelSite, publish, serving

MODEL = "demo-org/tiny-chat/fp32"


@pytest.fixture
def site(served_tp1, tmp_path):
    with serving(tmp_path / "site") as server:
        server.md5 = publish(served_tp1, server.root, MODEL)
        yield server


def download(site: ModelSite, dest: Path, name: str = MODEL, **env: str):
    e = launcher_env(dest / "log", MODEL_BASE_URL=site.base, **env)
    return run("download_model", "--model_name", name, "--dir", str(dest), env=e, cwd=dest, timeout=120)


def assert_complete(site: ModelSite, folder: Path) -> None:
    for rel, md5 in site.md5.items():
        assert hashlib.md5((folder / rel).read_bytes()).hexdigest() == md5, rel
    assert not list(folder.rglob("*.part")) and not (folder / ".downloading").exists()


def biggest(site: ModelSite) -> str:
    root = site.root / MODEL / "model"
    return max(site.md5, key=lambda rel: (root / rel).stat().st_size)


def test_full_download(site, tmp_path):
    res = download(site, tmp_path)
    assert res.returncode == 0, res.stderr
    assert_complete(site, tmp_path / MODEL)
    assert f"{len(site.md5)} files from {site.base}/{MODEL}/model" in res.stderr  # progress lines
    again = download(site, tmp_path)  # already there: verified, nothing fetched again
    assert again.returncode == 0 and not [
        r for r in site.requests[len(site.md5) + 1 :] if not r[0].endswith("file_list.txt")
    ]


def test_dropped_connection_is_resumed_with_range(site, tmp_path):
    big = biggest(site)
    size = (site.root / MODEL / "model" / big).stat().st_size
    site.drop[f"{MODEL}/model/{big}"] = size // 3
    res = download(site, tmp_path)
    assert res.returncode == 0, res.stderr
    first, second = [r[1] for r in site.requests if r[0] == f"{MODEL}/model/{big}"]
    assert first is None and 0 < int(RANGE.match(second).group(1)) <= size // 3  # resumed, not restarted
    assert "resuming" in res.stderr
    assert_complete(site, tmp_path / MODEL)


def test_leftover_part_file_is_resumed(site, tmp_path):
    big = biggest(site)
    data = (site.root / MODEL / "model" / big).read_bytes()
    part = tmp_path / MODEL / (big + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:1000])  # what an interrupted earlier run left
    res = download(site, tmp_path)
    assert res.returncode == 0, res.stderr
    assert (f"{MODEL}/model/{big}", "bytes=1000-") in site.requests
    assert_complete(site, tmp_path / MODEL)


def test_corrupted_file_is_caught_by_md5(site, tmp_path):
    big = biggest(site)
    served = site.root / MODEL / "model" / big
    data = bytearray(served.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the bucket now serves a damaged copy
    served.write_bytes(bytes(data))
    res = download(site, tmp_path)
    assert res.returncode == 1
    url = f"{site.base}/{MODEL}/model/{big}"
    assert "md5 mismatch" in res.stderr and url in res.stderr and str(tmp_path / MODEL / big) in res.stderr
    assert not (tmp_path / MODEL / big).exists() and not list((tmp_path / MODEL).rglob("*.part"))
    assert (tmp_path / MODEL / ".downloading").exists()  # start_server will not serve it


def test_unknown_model_name_is_refused(site, tmp_path):
    res = download(site, tmp_path, name="nobody/no-such-model")
    assert res.returncode == 1
    assert "nobody/no-such-model" in res.stderr and "HTTP 404" in res.stderr
    assert f"{site.base}/nobody/no-such-model/model/file_list.txt" in res.stderr
    assert res.stderr.count("\n") == 1  # one line, no traceback


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_start_server_serves_the_downloaded_model(site, tmp_path):
    env = launcher_env(tmp_path / "log", MODEL_DIR=str(tmp_path / "models"), MODEL_BASE_URL=site.base)
    with always_stopped(env, tmp_path):
        res = run("start_server", MODEL, env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr + res.stdout
        assert_complete(site, tmp_path / "models" / MODEL)
        assert str(tmp_path / "models" / MODEL) in res.stdout
        r = requests.post(
            f"http://127.0.0.1:{env['SERVICE_HTTP_PORT']}/v1/chat/completions",
            json={"text": "Hello", "max_dec_len": 8},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["tokens_all_num"] >= 1
        stop = run("stop_server", env=env, cwd=tmp_path, timeout=120)
        assert stop.returncode == 0 and processes_of(tmp_path / "log") == []


def test_parts_mtp_and_unsafe_file_lists(site, tmp_path):
    from spmd_serve.download import DownloadError, download_model, parse_file_list, part_name

    assert [part_name(1, "master"), part_name(2, "master"), part_name(2, "slave")] == ["model", "node1", "node2"]
    for bad in ("../evil:" + "0" * 32, "/etc/passwd:" + "0" * 32, "config.json:not-an-md5"):
        with pytest.raises(DownloadError, match="file_list.txt line 1"):
            parse_file_list(bad, "http://x/file_list.txt")
    shutil.copytree(site.root / MODEL / "model", site.root / MODEL / "mtp")  # a draft model part
    dest = download_model(MODEL, tmp_path / "m", speculate_model_path=tmp_path / "draft", base=site.base)
    assert_complete(site, dest)
    assert_complete(site, tmp_path / "draft")
