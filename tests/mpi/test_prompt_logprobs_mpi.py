"""The prompt scored, as lm-evaluation-harness asks an OpenAI server (`echo` with `logprobs`,
`max_tokens` 0 for the prompt alone): against `mpirun -n 2 spmd_serve` on the demo model with
16-token prefill chunks, every prompt token's logprob is PaddleNLP's own model's, streamed or not,
with the prefix cache holding the prompt already, and beside other requests in the same steps; and
vLLM's `prompt_logprobs` (each token's logprob and rank, its position's top k) against the same rows; vLLM's
return_token_ids beside the logprobs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi
TOP = 2


@pytest.fixture(scope="module")
def server(served_tp2, tmp_path_factory):
    with ServerProcess(
        2,
        served_tp2,
        tmp_path_factory.mktemp("logs") / "server.log",
        MAX_SEQ_LEN="200",
        MAX_DEC_LEN="64",
        SPMD_MAX_NUM_BATCHED_TOKENS="16",  # a 45-token prompt in three chunks
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="-", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def prompts(demo_checkpoint) -> list[list[int]]:
    from tests.support.paddlenlp_reference import load_reference_model

    vocab = load_reference_model(demo_checkpoint).config.vocab_size
    rng = np.random.default_rng(7)
    return [[1, *rng.integers(3, vocab, n - 1).tolist()] for n in (45, 17, 2)]


@pytest.fixture(scope="module")
def reference(demo_checkpoint, prompts) -> list[np.ndarray]:
    """PaddleNLP's log-softmax rows of each prompt, [len - 1, V] (row i: token i + 1's distribution)."""
    import paddle

    from tests.support.paddlenlp_reference import load_reference_model

    model = load_reference_model(demo_checkpoint)
    out = []
    with paddle.no_grad():
        for ids in prompts:
            x = model(input_ids=paddle.to_tensor([ids]), use_cache=False, return_dict=True).logits[0].numpy()
            x = x[:-1].astype(np.float64)
            out.append(
                x - (x.max(1, keepdims=True) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)))
            )
    return out


def _check_prompt_part(lp, ids: list[int], ref: np.ndarray) -> None:
    """The first len(ids) logprobs entries: the prompt's, against the reference rows."""
    n = len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    got = np.array(lp.token_logprobs[1:n])
    want = ref[np.arange(n - 1), ids[1:]]
    np.testing.assert_allclose(got, want, atol=2e-3)
    for i in range(1, n):
        top = lp.top_logprobs[i]  # by token text: two tokens of one text (bytes of a character) share a key
        assert 1 <= len(top) <= TOP and max(top.values()) >= got[i - 1] - 1e-6
        best = np.sort(ref[i - 1])[::-1][:TOP]
        assert all(np.abs(best - v).min() < 2e-3 for v in top.values()), (top, best)


def test_max_tokens_0_scores_the_prompt_alone(client, prompts, reference):
    for ids, ref in zip(prompts, reference):
        r = client.completions.create(model="default", prompt=ids, max_tokens=0, echo=True, logprobs=TOP)
        c = r.choices[0]
        assert len(c.logprobs.tokens) == len(ids) and c.finish_reason == "length"
        assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
        _check_prompt_part(c.logprobs, ids, ref)


def test_the_prompt_then_the_completion_streamed_or_not(client, prompts, reference):
    ids, ref = prompts[0], reference[0]
    kw = dict(model="default", prompt=ids, max_tokens=4, echo=True, logprobs=TOP, temperature=0)
    whole = client.completions.create(**kw).choices[0]
    assert len(whole.logprobs.tokens) == len(ids) + 4
    _check_prompt_part(whole.logprobs, ids, ref)
    chunks = list(client.completions.create(stream=True, **kw))
    streamed = [v for ch in chunks for v in ch.choices[0].logprobs.token_logprobs]
    assert streamed == whole.logprobs.token_logprobs
    assert "".join(ch.choices[0].text for ch in chunks) == whole.text


def test_a_cached_prefix_is_scored_all_the_same_beside_other_requests(client, prompts, reference):
    """The prompt computed (and its blocks cached) by a plain request first, then scored while other
    requests share the steps: every entry is still the model's."""
    ids, ref = prompts[0], reference[0]
    client.completions.create(model="default", prompt=ids, max_tokens=2)
    with ThreadPoolExecutor(4) as pool:
        plain = [pool.submit(client.completions.create, model="default", prompt=p, max_tokens=8) for p in prompts]
        scored = [
            pool.submit(client.completions.create, model="default", prompt=ids, max_tokens=0, echo=True, logprobs=TOP)
            for _ in range(2)
        ]
        for f in plain:
            assert f.result().choices[0].finish_reason in ("stop", "length")
        for f in scored:
            _check_prompt_part(f.result().choices[0].logprobs, ids, ref)


def test_max_tokens_0_without_echo_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="default", prompt="hello", max_tokens=0)


def _check_vllm_prompt_logprobs(entries: list, ids: list[int], ref: np.ndarray, k: int) -> None:
    """vLLM's prompt_logprobs: None, then per prompt token {id: {logprob, rank, decoded_token}}, the
    token's own first (its rank: how many tokens the reference puts at least as high, up to ties
    within the tolerance), then its position's top k (ranks 1..k) that are other tokens."""
    assert entries[0] is None and len(entries) == len(ids)
    tol = 2e-3
    for i, entry in enumerate(entries[1:]):
        row, tok = ref[i], ids[i + 1]
        own, *others = entry.items()
        assert int(own[0]) == tok and abs(own[1]["logprob"] - row[tok]) < tol
        assert (row > row[tok] + tol).sum() + 1 <= own[1]["rank"] <= (row >= row[tok] - tol).sum()
        best = np.argsort(-row, kind="stable")
        assert len(others) == (k - 1 if own[1]["rank"] <= k else k)  # the token itself listed once
        for t, v in others:
            assert 1 <= v["rank"] <= k and abs(v["logprob"] - row[int(t)]) < tol
            assert abs(row[best[v["rank"] - 1]] - v["logprob"]) < tol and isinstance(v["decoded_token"], str)


@pytest.mark.parametrize("k", [0, TOP])
def test_vllm_prompt_logprobs(client, prompts, reference, k):
    """vLLM's prompt_logprobs field, in completions (per choice, with n) and chat (once), against
    PaddleNLP's rows; refused with stream."""
    ids, ref = prompts[0], reference[0]
    r = client.completions.create(model="default", prompt=ids, max_tokens=2, n=2, extra_body={"prompt_logprobs": k})
    for c in r.choices:
        _check_vllm_prompt_logprobs(c.model_extra["prompt_logprobs"], ids, ref, k)
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_body={"prompt_logprobs": k}
    )
    assert chat.model_extra["prompt_logprobs"][0] is None and len(chat.model_extra["prompt_logprobs"]) > 1
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs are not available when stream=true"):
        client.completions.create(model="default", prompt=ids, stream=True, extra_body={"prompt_logprobs": k})


def test_return_token_ids_are_the_ids_scored(client, prompts):
    """vLLM's return_token_ids: the prompt's ids as sent, the answer's as its logprobs name them
    (return_tokens_as_token_ids), whole and streamed alike."""
    kw = dict(model="default", prompt=prompts[1], max_tokens=8, temperature=0, logprobs=0)
    kw["extra_body"] = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    got = client.completions.create(**kw).choices[0]
    assert got.model_extra["prompt_token_ids"] == prompts[1] and len(got.model_extra["token_ids"]) == 8
    assert [f"token_id:{t}" for t in got.model_extra["token_ids"]] == got.logprobs.tokens
    chunks = [c.choices[0].model_extra for c in client.completions.create(**kw, stream=True)]
    assert sum((c["token_ids"] for c in chunks), []) == got.model_extra["token_ids"]
    assert chunks[0]["prompt_token_ids"] == prompts[1] and not any(c.get("prompt_token_ids") for c in chunks[1:])


def test_sglang_generate_answers_as_completions(server, client, prompts, reference):
    """SGLang's /generate on the real model: a batch's ids, text and logprobs are what completions
    gives each prompt (greedy), whole and streamed; its prompt's logprobs from logprob_start_len are
    PaddleNLP's rows; and its /health_generate probe."""
    import json

    import requests

    url = f"http://127.0.0.1:{server.http_port}/generate"
    body = {"input_ids": prompts[1:], "sampling_params": {"max_new_tokens": 6, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": TOP, "logprob_start_len": 1}  # fmt: skip
    outs = requests.post(url, json=body, timeout=120).json()
    lines = requests.post(url, json={**body, "stream": True}, timeout=120).text.split("\n\n")
    last = {
        o["index"]: o for o in (json.loads(x[len("data: ") :]) for x in lines[:-2]) if o["meta_info"]["finish_reason"]
    }
    assert lines[-2:] == ["data: [DONE]", ""] and [last[i]["output_ids"] for i in (0, 1)] == [
        o["output_ids"] for o in outs
    ]
    for i, out in enumerate(outs):  # (streamed: in each line, as the output's logprobs)
        streamed = last[i]["meta_info"]["input_token_logprobs"]
        assert [e[1:] for e in streamed] == [e[1:] for e in out["meta_info"]["input_token_logprobs"]]
        assert [e[0] for e in streamed] == pytest.approx([e[0] for e in out["meta_info"]["input_token_logprobs"]])
    for prompt, ref, out in zip(prompts[1:], reference[1:], outs):
        entries, tops = out["meta_info"]["input_token_logprobs"], out["meta_info"]["input_top_logprobs"]
        assert [(tid, text) for _, tid, text in entries] == [(t, None) for t in prompt[1:]]  # (from position 1)
        assert [lp for lp, _, _ in entries] == pytest.approx([ref[i][t] for i, t in enumerate(prompt[1:])], abs=2e-3)
        # each position's top k: PaddleNLP's k best logprobs, each its token's
        assert [lp for top in tops for lp, _, _ in top] == pytest.approx(
            [v for row in ref for v in np.sort(row)[::-1][:TOP]], abs=2e-3
        )
        assert all(abs(ref[i][tid] - lp) < 2e-3 for i, top in enumerate(tops) for lp, tid, _ in top)
        c = client.completions.create(model="default", prompt=prompt, max_tokens=6, temperature=0, logprobs=TOP,
                                      extra_body={"return_token_ids": True}).choices[0]  # fmt: skip
        assert (out["output_ids"], out["text"]) == (c.model_extra["token_ids"], c.text)
        got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(c.logprobs.token_logprobs, abs=1e-5)
        assert (
            out["meta_info"]["prompt_tokens"] == len(prompt) and len(out["meta_info"]["output_top_logprobs"][0]) == TOP
        )
    whole = requests.post(url, json={**body, "input_ids": prompts[2], "logprob_start_len": 0}, timeout=120).json()
    assert whole["meta_info"]["input_token_logprobs"][0] == [None, prompts[2][0], None]  # (SGLang's: no logprob)
    assert whole["meta_info"]["input_top_logprobs"][0] is None and len(whole["meta_info"]["input_top_logprobs"]) == 2
    health = requests.get(f"http://127.0.0.1:{server.http_port}/health_generate", timeout=60)
    assert (health.status_code, health.content) == (200, b"")  # (SGLang's probe: one token made)
