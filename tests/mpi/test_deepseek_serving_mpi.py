"""Issue 14, must show: `--demo deepseek-tiny` served under `mpirun -n 2` (attention and shared
experts split by heads / units, routed experts by rank) through the official `openai` client and
the native protocol: greedy tokens equal PaddleNLP's DeepseekV3ForCausalLM on the demo weights,
and under a small KV pool requests are preempted, finish with the tokens they get from a big pool,
and every block is free afterwards.  The start-up log names the MLA cache's bytes per token, and
/metrics counts the tokens routed to each expert of each MoE layer."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from tests.support.server_process import ServerProcess, greedy_ids

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from spmd_serve.export import ensure_demo_model

    return ensure_demo_model("deepseek-tiny", tp=2, root=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def server(served, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with ServerProcess(2, str(served), log, MAX_SEQ_LEN="256", MAX_DEC_LEN="64") as srv:
        yield srv


def test_start_up_log_names_the_latent_cache_bytes(server):
    # 3 layers x (kv_lora_rank 32 + rope 16) x 4 bytes
    assert "576 KV bytes per token on each rank (mla_latent cache)" in server.log()


def test_native_greedy_equals_paddlenlp(server, served):
    import json

    from spmd_serve.export.demo.deepseek import make_weights
    from tests.support.deepseek_reference import reference_from_weights
    from tests.support.paddlenlp_reference import reference_logits

    cfg = json.loads((served / "config.json").read_text())
    cfg.pop("spmd_serve")
    ref = reference_from_weights(cfg, make_weights(cfg, 0))
    for prompt in ([1, 40, 41, 42], [1, *range(100, 140)]):
        got = greedy_ids(server.url, prompt, 12)
        logits = reference_logits(ref, prompt, got)
        logits[:, 2] = -np.inf  # min_dec_len = max_dec_len: EOS is not a choice
        gaps = [float(lg.max() - lg[t]) for lg, t in zip(logits, got)]
        assert max(gaps) < 1e-4, (prompt, got, gaps)


def test_openai_client_chat_and_completion(server):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=10, temperature=0
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 10
    kw = dict(model="default", prompt="Once upon a time", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert whole.usage.completion_tokens == 8


def test_preemption_under_a_small_pool_frees_every_block(served, server, tmp_path):
    """8 KV blocks of 16 tokens hold only two 47-token sequences: the rest wait or are preempted."""
    n_req, new = 12, 36
    prompts = [[1] + [(7 * i + j) % 900 + 3 for j in range(4 + i % 7)] for i in range(n_req)]
    expected = [greedy_ids(server.url, p, new) for p in prompts[:3]]  # big pool: no preemption
    small = ServerProcess(
        2, str(served), tmp_path / "server.log", BLOCK_SIZE="16", BLOCK_BS="2", MAX_SEQ_LEN="64", MAX_DEC_LEN="64"
    )
    with small:
        with ThreadPoolExecutor(n_req) as pool:
            got = list(pool.map(lambda p: greedy_ids(small.url, p, new), prompts))
        assert small.stop_gracefully() == 0
    assert all(len(g) == new for g in got)
    assert got[:3] == expected, "preemption changed a client's tokens"
    m = re.search(r"kv blocks free (\d+)/(\d+), preemptions (\d+)", small.log())
    assert m, small.log()[-2000:]
    free, total, preemptions = map(int, m.groups())
    assert free == total and preemptions > 0, (free, total, preemptions)


def test_metrics_count_the_tokens_routed_to_each_expert(server):
    """moe_expert_tokens_total{layer, expert}: a request of n prompt tokens and m new ones runs
    n + m - 1 tokens through each MoE layer (1 and 2; layer 0 is dense), each to k = 2 experts."""
    import requests

    from tests.support.metrics_scrape import P, Samples

    url = f"http://127.0.0.1:{server.env['METRICS_HTTP_PORT']}/metrics"

    def per_layer() -> dict[str, float]:
        fam = Samples(requests.get(url, timeout=10).text).families[P + "moe_expert_tokens"]
        out: dict[str, float] = {}
        for s in fam.samples:
            if s.name.endswith("_total"):
                assert 0 <= int(s.labels["expert"]) < 8
                out[s.labels["layer"]] = out.get(s.labels["layer"], 0.0) + s.value
        return out

    before = per_layer()
    prompt, new = [1, *range(200, 219)], 9
    greedy_ids(server.url, prompt, new)
    after = per_layer()
    assert sorted(after) == ["1", "2"]
    assert {layer: after[layer] - before.get(layer, 0.0) for layer in after} == {
        "1": 2 * (len(prompt) + new - 1),
        "2": 2 * (len(prompt) + new - 1),
    }
