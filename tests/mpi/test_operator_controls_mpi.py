"""An operator's commands on a real two-rank server (engine/control.py through the HTTP worker and
rank 0's hub): /reset_prefix_cache and /flush_cache make a repeated prompt find nothing cached,
also while a request holding those blocks runs (whose greedy tokens do not change); /abort_request
ends a streamed /generate by its rid with the greedy tokens it had so far, and every request with
abort_all, counted as aborts in /metrics; the server serves on as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from tests.support.metrics_scrape import Samples
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi
BLOCK = 16
SYSTEM = "You are an operator's test. Answer in one short sentence, and never repeat the question. "


@pytest.fixture(scope="module")
def server(served_tp2, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with ServerProcess(2, served_tp2, log, BLOCK_SIZE=str(BLOCK), MAX_DEC_LEN="512") as srv:
        srv.base = f"http://127.0.0.1:{srv.http_port}"
        srv.metrics_url = f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics"
        yield srv


def native(srv, n: int, text: str = "Where is the old mill?") -> dict[str, Any]:
    body = {"text": text, "system": SYSTEM, "max_dec_len": n, "min_dec_len": n, "temperature": 0}
    res = requests.post(srv.url, json={**body, "return_usage": True}, timeout=120)
    assert res.status_code == 200, res.text
    return res.json()


def post(srv, path: str, **body: Any) -> requests.Response:
    res = requests.post(srv.base + path, json=body or None, timeout=60)
    assert res.status_code == 200, res.text
    return res


def test_a_reset_forgets_the_cached_prefixes_and_changes_no_token(server):
    first = native(server, 4)
    assert first["usage"]["cached_tokens"] == 0 and native(server, 4)["usage"]["cached_tokens"] > 0
    assert post(server, "/reset_prefix_cache").content == b""
    again = native(server, 4)
    assert again["usage"]["cached_tokens"] == 0 and again["tokens_all_ids"] == first["tokens_all_ids"]
    assert native(server, 4)["usage"]["cached_tokens"] > 0
    assert requests.get(server.base + "/flush_cache", timeout=60).text == "Cache flushed.\n"
    assert native(server, 4)["usage"]["cached_tokens"] == 0

    # while a request that shares the cached blocks runs: it goes on unchanged, no one new finds them
    whole = native(server, 48)["tokens_all_ids"]
    body = {"text": "Where is the old mill?", "system": SYSTEM, "max_dec_len": 48, "min_dec_len": 48}
    with requests.post(server.url, json={**body, "temperature": 0, "stream": True}, stream=True, timeout=120) as r:
        frames = (json.loads(line) for line in r.iter_lines() if line)
        got = next(frames)["token_ids"]
        post(server, "/reset_prefix_cache")
        for frame in frames:
            got += frame["token_ids"]
    assert got == whole and native(server, 4)["usage"]["cached_tokens"] == 0
    assert "in use forgotten" in server.log()


def generate(srv, rid: str, n: int) -> requests.Response:
    body = {"text": SYSTEM + "Tell me a long story.", "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    res = requests.post(srv.base + "/generate", json=body, stream=True, timeout=120)
    assert res.status_code == 200, res.text
    return res


def lines_of(res: requests.Response) -> Any:
    return (
        json.loads(line[len("data: ") :])
        for line in res.iter_lines(decode_unicode=True)
        if line and line != "data: [DONE]"
    )


def test_abort_by_rid_and_abort_all(server):
    metrics = lambda: Samples(requests.get(server.metrics_url, timeout=10).text)  # noqa: E731
    before = metrics()
    reference = list(lines_of(generate(server, "ref", 400)))[-1]["output_ids"]
    with generate(server, "story", 400) as res:
        lines = lines_of(res)
        next(lines)
        assert post(server, "/abort_request", rid="story").json() == {"aborted": ["story"]}
        last = list(lines)[-1]
    meta = last["meta_info"]
    assert meta["finish_reason"] == {"type": "abort", "message": "aborted by /abort_request"}
    assert 1 <= meta["completion_tokens"] < 400 and last["output_ids"] == reference[: meta["completion_tokens"]]

    streams = [generate(server, f"all-{i}", 400) for i in range(3)]
    readers = [lines_of(s) for s in streams]
    for r in readers:
        next(r)
    assert sorted(post(server, "/abort_request", abort_all=True).json()["aborted"]) == ["all-0", "all-1", "all-2"]
    for r, s in zip(readers, streams):
        assert list(r)[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        s.close()
    assert metrics().delta(before, "request_success_total", finished_reason="abort") == 4
    assert native(server, 3)["tokens_all_num"] == 3  # serving on
