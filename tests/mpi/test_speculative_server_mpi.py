"""A real server with SPECULATE_METHOD=ngram (issue 15): streaming frames may carry several tokens
and add up to the non-streamed answer, which is plain decoding's (the same server's answer with
drafts unusable is the reference: the engine test tier proves tokens equal plain decoding's); a
stop string ends the text and the token count where it would without speculation; /metrics
counts the drafts verified and accepted, by method.  SPECULATE_METHOD=draft_model too: the served
model drafting for itself gives the same answer with every greedy draft accepted, counted under
method="draft_model", its draft plans timed as the step's "draft" phase.  SPECULATE_METHOD=mtp on
deepseek-tiny (its MTP layer's `mtp/` export) answers as plain decoding does, counted under
method="mtp"; on an export without an MTP layer it is refused at start in one line.  JSON answers
(a schema's, json_object's) are the same with drafts from either method."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support.failing_jobs import error_lines, run_job
from tests.support.metrics_scrape import Samples
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi
# the random-weight demo's greedy answer to this falls into loops after ~60 tokens: the n-gram
# proposer's probes find them and its drafts are accepted
BODY = {"text": "Tell me about bread.", "temperature": 0, "max_dec_len": 128, "min_dec_len": 128}


@pytest.fixture(scope="module")
def server(served_tp1, tmp_path_factory):
    env = {"SPECULATE_METHOD": "ngram", "SPECULATE_MAX_DRAFT_TOKEN_NUM": "4"}
    with ServerProcess(1, served_tp1, tmp_path_factory.mktemp("logs") / "server.log", **env) as srv:
        srv.metrics_url = f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics"
        yield srv


@pytest.fixture(scope="module")
def draft_server(served_tp1, tmp_path_factory):
    # drafting every step (no per-step rule, no speed gate): the streamed answer must show a frame
    # of draft + target tokens whatever this machine's timing says about drafting's cost
    env = {
        "SPECULATE_METHOD": "draft_model",
        "SPECULATE_MODEL_PATH": str(served_tp1),
        "SPMD_SPECULATE_MIN_ACCEPTANCE": "0",
    }
    with ServerProcess(1, served_tp1, tmp_path_factory.mktemp("logs") / "server.log", **env) as srv:
        srv.metrics_url = f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics"
        yield srv


@pytest.fixture(scope="module")
def tok(demo_checkpoint):
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    return ServingTokenizer.from_model_dir(demo_checkpoint)


def stream(srv, body: dict) -> list[dict]:
    with requests.post(srv.url, json={**body, "stream": True}, stream=True, timeout=120) as res:
        return [json.loads(line) for line in res.iter_lines() if line]


def test_frames_carry_the_accepted_tokens_and_add_up_to_the_answer(server):
    whole = requests.post(server.url, json=BODY, timeout=120).json()
    frames = stream(server, BODY)
    assert whole["error_code"] == 0 and whole["tokens_all_num"] == 128
    assert [t for f in frames for t in f["token_ids"]] == whole["tokens_all_ids"]
    assert "".join(f["token"] for f in frames) == whole["result"]
    # drafts accepted: several tokens in a frame, at most SPECULATE_MAX_DRAFT_TOKEN_NUM + 1
    assert 1 < max(len(f["token_ids"]) for f in frames) <= 5
    s = Samples(requests.get(server.metrics_url, timeout=10).text)
    drafts, accepted = (s.get(f"spec_decode_num_{k}_tokens_total", method="ngram") for k in ("draft", "accepted"))
    assert 0 < accepted <= drafts
    assert s.get("spec_decode_draft_acceptance_rate", method="ngram") == pytest.approx(accepted / drafts)


def test_a_stop_string_ends_where_it_would_without_speculation(server, tok):
    whole = requests.post(server.url, json=BODY, timeout=120).json()
    ids, text = whole["tokens_all_ids"], whole["result"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    # plain decoding stops at the first token whose text completes the stop string
    need = next(m for m in range(1, len(ids) + 1) if stop in tok.decode(ids[:m]))
    body = {**BODY, "stop_sequences": [stop]}
    for got in (requests.post(server.url, json=body, timeout=120).json(), stream(server, body)[-1]):
        assert got["tokens_all"] == text[: text.index(stop)]
        assert got["tokens_all_num"] == need and got["tokens_all_ids"] == ids[:need]


def test_a_draft_model_gives_the_answer_of_plain_decoding_counted_by_method(server, draft_server):
    want = requests.post(server.url, json=BODY, timeout=120).json()  # plain decoding's tokens (above)
    got = requests.post(draft_server.url, json={**BODY, "max_dec_len": 40, "min_dec_len": 40}, timeout=120).json()
    assert got["error_code"] == 0 and got["tokens_all_ids"] == want["tokens_all_ids"][:40]
    frames = stream(draft_server, BODY)
    assert [t for f in frames for t in f["token_ids"]] == want["tokens_all_ids"]
    assert max(len(f["token_ids"]) for f in frames) == 2  # SPECULATE_MAX_DRAFT_TOKEN_NUM=1: a draft + the target's
    s = Samples(requests.get(draft_server.metrics_url, timeout=10).text)
    drafts, accepted = (s.get(f"spec_decode_num_{k}_tokens_total", method="draft_model") for k in ("draft", "accepted"))
    assert 0 < accepted == drafts  # the model drafting for itself: every greedy draft is right
    assert s.get("step_phase_seconds_total", phase="draft") > 0


@pytest.fixture(scope="module")
def mtp_servers(tmp_path_factory):
    """deepseek-tiny at TP 1 served plainly and with its MTP layer drafting."""
    from spmd_serve.export import ensure_demo_model

    model = ensure_demo_model("deepseek-tiny", tp=1, root=tmp_path_factory.mktemp("cache"))
    logs = tmp_path_factory.mktemp("logs")
    env = {"SPECULATE_METHOD": "mtp", "SPECULATE_MAX_DRAFT_TOKEN_NUM": "2"}
    with ServerProcess(1, model, logs / "plain.log") as plain, ServerProcess(1, model, logs / "mtp.log", **env) as mtp:
        mtp.metrics_url = f"http://127.0.0.1:{mtp.env['METRICS_HTTP_PORT']}/metrics"
        yield plain, mtp


def test_the_mtp_layer_gives_the_answer_of_plain_decoding_counted_by_method(mtp_servers):
    plain, mtp = mtp_servers
    body = {**BODY, "max_dec_len": 40, "min_dec_len": 40}
    want = requests.post(plain.url, json=body, timeout=120).json()
    got = requests.post(mtp.url, json=body, timeout=120).json()
    assert got["error_code"] == 0 and got["tokens_all_ids"] == want["tokens_all_ids"]
    s = Samples(requests.get(mtp.metrics_url, timeout=10).text)
    assert s.get("spec_decode_num_draft_tokens_total", method="mtp") > 0
    assert s.get("step_phase_seconds_total", phase="draft") > 0


def test_mtp_on_a_model_without_an_mtp_layer_is_refused_at_start(served_tp1):
    res = run_job(1, MODEL_DIR=str(served_tp1), MP_NUM="1", SPECULATE_METHOD="mtp")
    lines = error_lines(res)
    assert res.returncode != 0 and len(lines) == 1, res.stderr[-2000:]
    assert f"SPECULATE_METHOD=mtp: MODEL_DIR={served_tp1} has no MTP draft (mtp/)" in lines[0]


def test_json_answers_verify_drafts_as_plain_decoding(server, draft_server):
    """JSON schemas with drafts: the draft model drafts without the schema's mask, so its drafts
    leave the grammar and are refused at verification; the n-gram server's greedy answers, drafts
    mostly unusable, are the reference.  Both give the same answers, each on its way to the schema's
    value, and one whole where it stopped."""
    import openai

    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
              "b": {"enum": ["yes", "no"]}, "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
              "required": ["a", "b", "c"]}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    answers = []
    for srv in (server, draft_server):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="x", max_retries=0)
        answers.append([
            client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": f"Describe cat {i}."}], max_tokens=60,
                temperature=0, response_format=fmt if i < 3 else {"type": "json_object"},
            ).choices[0]
            for i in range(5)
        ])  # fmt: skip
    assert [(c.message.content, c.finish_reason) for c in answers[0]] == [
        (c.message.content, c.finish_reason) for c in answers[1]
    ]
    from spmd_serve.engine.grammar_table import complete
    from spmd_serve.engine.json_schema import grammar

    for c, g in zip(answers[1], [grammar(json.dumps(schema))] * 3 + [grammar('{"type":"object"}')] * 2):
        state = g.step(g.start, c.message.content.encode())  # (a random-weight model: it may not stop)
        assert state is not None and (c.finish_reason == "length" or complete(state)), c.message.content
