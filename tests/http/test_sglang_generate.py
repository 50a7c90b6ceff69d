"""SGLang's `POST /generate` over real sockets with a fake engine (which echoes its prompt after
BOS): one prompt or a batch, text or input_ids, SGLang's sampling_params, the output as SGLang writes
it (text, output_ids, meta_info with finish_reason, token counts, logprobs), whole and streamed (each
line the text and ids so far, then [DONE]) alike; what it does not build is refused by name."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support.fake_tokenizer import EOS, FakeTokenizer


@pytest.fixture
def srv(make_server):
    return make_server(max_dec_len=64)


def generate(srv, **body) -> requests.Response:
    return requests.post(srv.base + "/generate", json=body, timeout=30)


def streamed(srv, **body) -> list:
    r = requests.post(srv.base + "/generate", json={**body, "stream": True}, stream=True, timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    lines = [line[len("data: ") :] for line in r.iter_lines(decode_unicode=True) if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def ids(text: str) -> list[int]:
    return FakeTokenizer().encode(text)


def test_one_prompt_whole_and_streamed(srv):
    body = {"text": "abc", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}
    out = generate(srv, **body).json()
    assert (out["text"], out["output_ids"]) == ("abcab", ids("abcab"))
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 5} and len(meta["id"]) == 32
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (4, 5, 0)  # (BOS + abc)
    assert meta["e2e_latency"] > 0
    lines = streamed(srv, **body)
    assert [line["text"] for line in lines] == ["a", "ab", "abc", "abca", "abcab"]  # (the text so far)
    assert lines[-1]["output_ids"] == out["output_ids"] and lines[-1]["meta_info"]["finish_reason"] == (
        meta["finish_reason"])  # fmt: skip
    assert all(line["meta_info"]["finish_reason"] is None for line in lines[:-1])


def test_the_default_budget_and_input_ids(srv):
    out = generate(srv, input_ids=ids("xy")).json()  # (no BOS: the ids as sent)
    # (SGLang's default max_new_tokens, 128, bounded by this server's MAX_DEC_LEN)
    assert out["meta_info"]["prompt_tokens"] == 2 and out["meta_info"]["completion_tokens"] == 64


def test_stops_match_and_trim(srv):
    out = generate(srv, text="abcabc", sampling_params={"stop": "ca", "max_new_tokens": 9}).json()
    assert out["text"] == "ab" and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "ca"}
    out = generate(srv, text="abcabc", sampling_params={"stop": ["ca"], "no_stop_trim": True, "max_new_tokens": 9})
    assert out.json()["text"] == "abca"
    c = ids("c")[0]
    out = generate(srv, text="abcabc", sampling_params={"stop_token_ids": [c], "max_new_tokens": 9}).json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": c} and out["output_ids"][-1] == c
    eos = generate(srv, input_ids=[ids("a")[0], EOS], sampling_params={"max_new_tokens": 9}).json()
    assert eos["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}


def test_a_batch_and_n_answer_a_list(srv):
    body = {"text": ["ab", "xyz"], "sampling_params": {"max_new_tokens": 3}, "rid": ["r1", "r2"]}
    outs = generate(srv, **body).json()
    assert [(o["text"], o["meta_info"]["id"]) for o in outs] == [("aba", "r1"), ("xyz", "r2")]
    lines = streamed(srv, **body)
    last = {line["index"]: line for line in lines if line["meta_info"]["finish_reason"]}
    assert [last[i]["text"] for i in (0, 1)] == ["aba", "xyz"]
    outs = generate(srv, text="ab", sampling_params={"max_new_tokens": 2, "n": 2, "sampling_seed": 3}).json()
    assert [o["text"] for o in outs] == ["ab", "ab"] and outs[0]["meta_info"]["id"] != outs[1]["meta_info"]["id"]
    one = generate(srv, text=["ab"], sampling_params={"max_new_tokens": 2}).json()
    assert isinstance(one, list) and one[0]["text"] == "ab"


def test_logprobs(srv):
    body = {"text": "ab", "sampling_params": {"max_new_tokens": 2}, "return_logprob": True, "top_logprobs_num": 2}
    meta = generate(srv, **body).json()["meta_info"]
    a, b = ids("ab")
    assert meta["output_token_logprobs"] == [[-0.5, a, None], [-0.5, b, None]]  # (the fake's: -0.5 each)
    assert meta["output_top_logprobs"][0] == [[-0.5, a, None], [-1.5, a - 1, None]]
    assert meta["input_token_logprobs"] == meta["input_top_logprobs"] == []  # (logprob_start_len -1, the default)
    meta = generate(srv, **body, return_text_in_logprobs=True).json()["meta_info"]
    assert [t for _, _, t in meta["output_token_logprobs"]] == ["a", "b"]
    assert streamed(srv, **body)[-1]["meta_info"]["output_token_logprobs"] == [[-0.5, a, None], [-0.5, b, None]]
    assert "output_token_logprobs" not in generate(srv, text="ab", sampling_params={"max_new_tokens": 2}).json()[
        "meta_info"]  # fmt: skip


@pytest.mark.parametrize(
    "body, words",
    [
        ({"text": "a", "input_ids": [5]}, "either text or input_ids"),
        ({"input_ids": ["a", "b"]}, "input_ids must be a list of token ids"),
        ({"input_ids": []}, "input_ids must be a list of token ids"),
        ({"input_ids": [[5], [-1]]}, "input_ids must be"),
        ({"text": ["a", 5]}, "text must be a string or a non-empty list of strings"),
        ({"sampling_params": {"max_new_tokens": 2}}, "either text or input_ids"),
        ({"text": "a", "sampling_params": {"beam_width": 2}}, "sampling_params.beam_width: not supported"),
        ({"text": "a", "sampling_params": {"max_new_tokens": 10**6}}, "sampling_params.max_new_tokens"),
        ({"text": "a", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"text": "a", "image_data": "x.png"}, "image_data: not supported"),
        ({"text": "a", "frobnicate": 1}, "frobnicate: not a field of /generate"),
        ({"text": "a", "logprob_start_len": -2}, "logprob_start_len must be an integer in [-1, "),
        ({"text": ["a", "b"], "rid": "one"}, "rid must be a non-empty string for each of the 2"),
        ({"text": ["a", "b"], "sampling_params": [{"top_k": 1}, {"top_k": 2}]}, "sampling_params must be an object"),
        (
            {"text": "a", "sampling_params": {"max_new_tokens": 2}, "return_logprob": True, "top_logprobs_num": 21},
            "top_logprobs_num",
        ),
    ],
)
def test_what_is_not_built_or_bad_is_refused_by_name(srv, body, words):
    r = generate(srv, **body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_health_generate_and_model_info(make_server, monkeypatch):
    """SGLang's probes: /health_generate is 200 once a token is made, 503 naming why otherwise (not
    ready; an engine that makes no token in time); /get_model_info names the served model."""
    from spmd_serve.frontend.sglang import info

    srv = make_server()
    r = requests.get(srv.base + "/health_generate", timeout=30)
    assert (r.status_code, r.content) == (200, b"") and srv.engine.added[-1].params.max_tokens == 1
    monkeypatch.setattr(info, "HEALTH_GENERATE_S", 0.3)
    srv.engine.pause()
    r = requests.get(srv.base + "/health_generate", timeout=30)
    assert r.status_code == 503 and "deadline" in r.json()["error"]["message"]
    srv.engine.paused.clear()
    assert requests.get(make_server(ready=False).base + "/health_generate", timeout=30).status_code == 503
    model = requests.get(srv.base + "/get_model_info", timeout=30).json()
    assert (model["model_path"], model["is_generation"], model["has_image_understanding"]) == ("default", True, False)
