"""The special tokens a text prompt gets are the tokenizer's own (issue 17): `/v1/completions` and a
native `text` without a chat template add the BOS / EOS that tokenizer_config.json's
`add_bos_token` / `add_eos_token` ask for — none for the demo model, whose config says
`add_bos_token: false` — as HF's `tokenizer(text)`, vLLM, llama.cpp and the original tool's
`tokenizer(text, add_special_tokens=True)` do; tokenizer.json's post-processor where the config
says nothing.  Nothing a user sent is changed behind their back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spmd_serve.export.demo.checkpoint import write_demo_checkpoint
from spmd_serve.frontend.common.parsing import Limits
from spmd_serve.frontend.openai.protocol import parse_openai
from spmd_serve.frontend.text.tokenizer import ServingTokenizer
from tests.support.hf_tokenizer_dirs import write_byte_level_dir

LIMITS = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)
TEXT = "Once upon a time"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    return write_demo_checkpoint(tmp_path_factory.mktemp("demo") / "tiny", "tiny")


def variant(src: Path, dst: Path, template: bool = True, **config) -> Path:
    """A copy of a tokenizer directory with tokenizer_config.json changed (a key set to None is removed)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg.update(config)
    if not template:
        cfg.pop("chat_template", None)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def completion_ids(tok: ServingTokenizer, **body) -> list[int]:
    req = parse_openai("completion", {"model": "m", "prompt": TEXT, "max_tokens": 2, **body}, tok, LIMITS, ("m",))
    return req.prompts[0]


def test_demo_config_says_no_bos_so_none_is_added(demo_dir):
    tok = ServingTokenizer.from_model_dir(demo_dir)
    assert json.loads((demo_dir / "tokenizer_config.json").read_text())["add_bos_token"] is False
    assert completion_ids(tok) == tok.encode(TEXT) and tok.bos_token_id not in completion_ids(tok)
    assert completion_ids(tok, add_special_tokens=False) == tok.encode(TEXT)


def test_add_bos_token_true_adds_exactly_one(demo_dir, tmp_path):
    tok = ServingTokenizer.from_model_dir(variant(demo_dir, tmp_path / "bos", add_bos_token=True))
    assert completion_ids(tok) == [tok.bos_token_id] + tok.encode(TEXT)
    assert completion_ids(tok, add_special_tokens=False) == tok.encode(TEXT)  # vLLM's switch
    assert completion_ids(tok, prompt=[5, 6]) == [5, 6]  # token ids are sent as they are


@pytest.mark.parametrize("add_bos", [True, False])
def test_native_text_without_a_template_follows_the_tokenizer(demo_dir, tmp_path, add_bos):
    """The original tool: no chat template -> tokenizer(text, add_special_tokens=True)."""
    tok = ServingTokenizer.from_model_dir(variant(demo_dir, tmp_path / "t", template=False, add_bos_token=add_bos))
    assert not tok.has_chat_template
    assert tok.encode_prompt(text=TEXT) == [tok.bos_token_id] * add_bos + tok.encode(TEXT)


def test_a_chat_template_writes_its_own_bos_and_nothing_is_added(demo_dir, tmp_path):
    tok = ServingTokenizer.from_model_dir(variant(demo_dir, tmp_path / "t", add_bos_token=True))
    ids = tok.encode_prompt(text=TEXT)
    assert ids.count(tok.bos_token_id) == 1 and ids == tok.encode(tok.render_chat([{"role": "user", "content": TEXT}]))


def with_bos_post_processor(d: Path) -> Path:
    """tokenizer.json framing every sequence with <|begin_of_text|>, as Llama-3's does."""
    spec = json.loads((d / "tokenizer.json").read_text())
    bos = "<|begin_of_text|>"
    a, b = {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, a],
        "pair": [a, b],
        "special_tokens": {bos: {"id": bos, "ids": [spec["model"]["vocab"][bos]], "tokens": [bos]}},
    }
    (d / "tokenizer.json").write_text(json.dumps(spec))
    return d


@pytest.mark.parametrize("add_bos", [None, True, False])
def test_tokenizer_json_post_processor_unless_the_config_says_otherwise(tmp_path, add_bos):
    src = with_bos_post_processor(write_byte_level_dir(tmp_path / "src", "llama3"))
    tok = ServingTokenizer.from_model_dir(variant(src, tmp_path / "t", add_bos_token=add_bos), use_hf_tokenizer=True)
    wanted = [tok.bos_token_id] if add_bos in (None, True) else []
    assert completion_ids(tok) == wanted + tok.encode(TEXT)
