"""`mpirun -n 2 spmd_serve` end to end: the original docs' request examples read exactly as the
docs read them, concurrent greedy requests equal PaddleNLP, preemption under a small KV pool is
invisible to clients, and the job stops as a whole (worker killed, SIGTERM to rank 0)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support.server_process import ServerProcess, greedy_ids, rank_pid

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def server(served_tp2, tmp_path_factory):
    # USE_WARMUP=1: a warm-up request runs through both ranks before the server reports ready
    with ServerProcess(2, served_tp2, tmp_path_factory.mktemp("logs") / "server.log", USE_WARMUP="1") as srv:
        yield srv


def read_stream(res: requests.Response) -> list[dict]:
    """Exactly as the original documentation reads a stream."""
    frames = []
    for line in res.iter_lines():
        frames.append(json.loads(line))
    return frames


def check_stream(frames: list[dict], req_id: str, max_dec_len: int) -> None:
    assert frames and all(f["req_id"] == req_id for f in frames)
    assert [f["is_end"] for f in frames] == [0] * (len(frames) - 1) + [1]
    assert [f["send_idx"] for f in frames] == list(range(len(frames)))
    last = frames[-1]
    assert last["error_code"] == 0 and last["finish_reason"] in ("stop", "length")
    assert "".join(f["token"] for f in frames) == last["tokens_all"]
    assert sum((f["token_ids"] for f in frames), []) == last["tokens_all_ids"]
    assert 1 <= last["tokens_all_num"] == len(last["tokens_all_ids"]) <= max_dec_len


def test_docs_single_text_stream(server):
    req_id = str(uuid.uuid1())
    data_single = {"text": "Hello, how are you?", "req_id": req_id, "max_dec_len": 64, "stream": True}
    res = requests.post(server.url, json=data_single, stream=True, timeout=60)
    assert res.status_code == 200 and res.headers["Content-Type"].startswith("application/x-ndjson")
    check_stream(read_stream(res), req_id, 64)


def test_docs_multi_turn_messages_stream(server):
    req_id = str(uuid.uuid1())
    data_multi = {
        "messages": [
            {"role": "user", "content": "Hello, who are you"},
            {"role": "system", "content": "I'm a helpful AI assistant."},
            {"role": "user", "content": "List 3 countries and their capitals."},
        ],
        "req_id": req_id,
        "max_dec_len": 64,
        "stream": True,
    }
    res = requests.post(server.url, json=data_multi, stream=True, timeout=60)
    assert res.status_code == 200
    check_stream(read_stream(res), req_id, 64)


def test_docs_non_stream(server):
    req_id = str(uuid.uuid1())
    res = requests.post(
        server.url,
        json={"text": "Hello, how are you?", "req_id": req_id, "max_dec_len": 20, "min_dec_len": 20},
        timeout=60,
    )
    body = res.json()
    assert res.status_code == 200 and body["req_id"] == req_id and body["error_code"] == 0
    assert body["result"] == body["tokens_all"] and body["tokens_all_num"] == 20 == len(body["tokens_all_ids"])
    assert body["finish_reason"] == "length"


PROMPTS = [[1, 17, 300, 45], [1] + list(range(40, 70)), [1, 900, 901, 5, 6, 7, 8, 9, 10, 11, 12], [1] + [88] * 50]


def test_concurrent_greedy_equals_paddlenlp(server, demo_checkpoint):
    from tests.support.paddlenlp_reference import load_reference_model, reference_generate

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        served = list(pool.map(lambda p: greedy_ids(server.url, p, 10), PROMPTS))
    model = load_reference_model(demo_checkpoint)
    assert served == [reference_generate(model, p, 10, mask_eos=True) for p in PROMPTS]  # min_dec_len = max


def test_bad_requests_get_contract_errors_and_server_stays_healthy(server):
    cases = [
        ({"text": "hi", "max_dec_len": "x"}, 400),
        ({"text": "hi", "max_dec_len": 10**6}, 400),
        ({"max_dec_len": 3}, 400),
        ("not json", 400),
    ]
    for body, status in cases:
        kw = {"data": body} if isinstance(body, str) else {"json": body}
        res = requests.post(server.url, timeout=30, **kw)
        assert res.status_code == status and res.json()["error_code"] == status and res.json()["error_msg"]
    assert requests.get(f"http://127.0.0.1:{server.health_port}/v2/health/ready", timeout=5).status_code == 200


def test_32_concurrent_requests_under_preemption(served_tp2, tmp_path, server):
    """8 KV blocks of 16 tokens hold only two 50-token sequences: the rest wait or are preempted."""
    n_req, new = 32, 40
    prompts = [[1] + [(7 * i + j) % 900 + 3 for j in range(4 + i % 7)] for i in range(n_req)]
    expected = [greedy_ids(server.url, p, new) for p in prompts[:4]]  # big pool: no preemption
    small = ServerProcess(
        2,
        served_tp2,
        tmp_path / "server.log",
        BLOCK_SIZE="16",
        BLOCK_BS="2",
        MAX_SEQ_LEN="64",
        MAX_DEC_LEN="64",
        BATCH_SIZE="32",
    )
    with small:
        with ThreadPoolExecutor(n_req) as pool:
            got = list(pool.map(lambda p: greedy_ids(small.url, p, new), prompts))
        assert small.stop_gracefully() == 0
    assert all(len(g) == new for g in got)
    assert got[:4] == expected, "preemption changed a client's tokens"
    m = re.search(r"kv blocks free (\d+)/(\d+), preemptions (\d+)", small.log())
    assert m, small.log()[-2000:]
    free, total, preemptions = map(int, m.groups())
    assert total == 8 and free == total and preemptions > 0


def wait_exit(srv: ServerProcess, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while srv.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return srv.proc.poll()


def test_killing_a_worker_ends_the_job(served_tp2, tmp_path):
    with ServerProcess(2, served_tp2, tmp_path / "server.log") as srv:
        os.kill(rank_pid(srv, 1), signal.SIGKILL)
        t0 = time.monotonic()
        rc = wait_exit(srv, 30)
        assert rc is not None, "job still running 30 s after a rank was killed"
        assert rc != 0 and time.monotonic() - t0 < 30


def test_sigterm_to_rank0_stops_every_rank(served_tp2, tmp_path):
    with ServerProcess(2, served_tp2, tmp_path / "server.log") as srv:
        pids = srv.rank_pids()
        assert srv.stop_gracefully(30) == 0, srv.log()[-2000:]
        assert all(not os.path.exists(f"/proc/{p}") for p in pids)
        assert "engine stopped" in srv.log()


def test_seeded_sampling_is_reproducible_whatever_the_batch(server):
    """The per-request seed fixes the tokens, alone or batched with other traffic."""

    def sampled(seed: int, text: str = "Tell me a story about the sea.") -> list[int]:
        body = {"text": text, "temperature": 0.9, "topp": 0.9, "seed": seed, "max_dec_len": 16, "min_dec_len": 16}
        res = requests.post(server.url, json=body, timeout=60)
        assert res.status_code == 200, res.text
        return res.json()["tokens_all_ids"]

    alone = sampled(1234)
    with ThreadPoolExecutor(4) as pool:
        batched = list(pool.map(lambda a: sampled(*a), [(1234,), (7, "Other text"), (1234,), (8, "More")]))
    assert batched[0] == batched[2] == alone
    assert sampled(999) != alone
