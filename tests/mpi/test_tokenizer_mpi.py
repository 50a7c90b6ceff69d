"""`mpirun -n 1 spmd_serve` end to end for tokenizers: a greedy answer to a CJK/emoji prompt
streams frame by frame as valid UTF-8 and joins to the non-streaming text, with PaddleNLP's
SentencePiece tokenizer (default) and with USE_HF_TOKENIZER=1 on a tokenizer.json of the same
model of SentencePiece/Llama type (Metaspace, byte fallback); a chat template that does not
compile and USE_HF_TOKENIZER=1 without tokenizer.json stop start-up with one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import requests

from tests.support.failing_jobs import error_lines, run_job
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi
PROMPT = "用中文回答：你好，世界！🌍😊 What is 2+2? 🧪"


@pytest.mark.parametrize("tokenizer", ["paddlenlp", "tokenizer.json"])
def test_cjk_emoji_stream_equals_non_stream(served_tp1, tmp_path, tokenizer):
    body = {"text": PROMPT, "max_dec_len": 48, "min_dec_len": 48, "temperature": 0}
    model, env = served_tp1, {}
    if tokenizer == "tokenizer.json":
        model, env = _with_sentencepiece_tokenizer_json(served_tp1, tmp_path / "model"), {"USE_HF_TOKENIZER": "1"}
    with ServerProcess(1, model, tmp_path / "server.log", **env) as srv:
        plain = requests.post(srv.url, json={**body, "req_id": "plain"}, timeout=120).json()
        res = requests.post(srv.url, json={**body, "req_id": "s", "stream": True}, stream=True, timeout=120)
        frames = []
        for raw in res.iter_lines():
            frames.append(json.loads(raw.decode("utf-8")))  # strict: each frame is UTF-8
    tokens = [f["token"] for f in frames]
    for t in tokens:
        t.encode("utf-8")  # no lone surrogates
    assert plain["error_code"] == 0 and frames[-1]["is_end"] == 1
    assert "".join(tokens) == plain["result"] == frames[-1]["tokens_all"]
    assert sum((f["token_ids"] for f in frames), []) == plain["tokens_all_ids"]
    if "\ufffd" not in plain["result"]:
        assert not any("\ufffd" in t for t in tokens)
    # the answer has characters of 2..4 UTF-8 bytes, so frames had partial characters to hold back
    assert any(len(ch.encode()) > 1 for ch in plain["result"]), plain["result"]


def _with_sentencepiece_tokenizer_json(served: Path, model: Path) -> Path:
    """A copy of the served demo model with a tokenizer.json converted from its tokenizer.model;
    the prompt encodes to the same ids through both."""
    from spmd_serve.export.demo.checkpoint import CHAT_MARKERS
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer
    from tests.support.hf_tokenizer_dirs import sentencepiece_tokenizer_json

    shutil.copytree(served, model)
    (model / "tokenizer.json").write_text(sentencepiece_tokenizer_json(model / "tokenizer.model", CHAT_MARKERS))
    hf, sp = ServingTokenizer.from_model_dir(model, True), ServingTokenizer.from_model_dir(model)
    assert type(hf._tok).__name__ == "HFTokenizer" and hf.encode(PROMPT) == sp.encode(PROMPT)
    return model


@pytest.mark.parametrize("case", ["bad chat template", "USE_HF_TOKENIZER without tokenizer.json"])
def test_tokenizer_problems_stop_start_up_with_one_line(served_tp1, tmp_path, case):
    model = tmp_path / "model"
    shutil.copytree(served_tp1, model)
    env = {"MODEL_DIR": str(model), "MP_NUM": "1"}
    if case == "bad chat template":
        cfg = json.loads((model / "tokenizer_config.json").read_text())
        cfg["chat_template"] = "{% for m in messages %}{{ m.content }"
        (model / "tokenizer_config.json").write_text(json.dumps(cfg))
        expect = "invalid chat_template"
    else:
        (model / "tokenizer.json").unlink(missing_ok=True)
        env["USE_HF_TOKENIZER"] = "1"
        expect = "USE_HF_TOKENIZER=1 needs"
    res = run_job(1, timeout=120, **env)  # free ports: a default one another job holds would fail it first
    lines = error_lines(res)
    assert res.returncode != 0 and len(lines) == 1 and expect in lines[0], res.stderr[-2000:]
    assert "cannot load the tokenizer of" in lines[0] and "Traceback" not in res.stderr
