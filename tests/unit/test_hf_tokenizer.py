"""USE_HF_TOKENIZER=1 (tokenizer.json through `tokenizers`), chat templates rendered as the
tokenizer's own apply_chat_template renders them (HF transformers' and PaddleNLP's), and eos ids
from generation_config.json.  Every tokenizer directory is written here, offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spmd_serve.frontend.text.tokenizer import ServingTokenizer
from tests.support.hf_tokenizer_dirs import FEATURES_TEMPLATE, LLAMA3_TEMPLATE, QWEN2_TEMPLATE, write_byte_level_dir
from tests.support.scheduler_harness import default_fn, make_scheduler, run

CJK_EMOJI = "你好，世界！🌍 Ünïcödé test 😊 结束。🧪🧬"
# system + multi-turn, non-ASCII, surrounding spaces (Llama-3 trims them), HTML-ish characters
CHAT = [
    {"role": "system", "content": "Answer briefly & in <b>bold</b>."},
    {"role": "user", "content": "Hi! 你好 🎉"},
    {"role": "assistant", "content": "Hello, how can I help?"},
    {"role": "user", "content": "  What is 2+2?  "},
]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    return write_byte_level_dir(tmp_path_factory.mktemp("hf") / "qwen2", "qwen2")


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory) -> Path:
    return write_byte_level_dir(tmp_path_factory.mktemp("hf") / "llama3", "llama3")


@pytest.fixture(scope="module")
def qwen(qwen_dir) -> ServingTokenizer:
    return ServingTokenizer.from_model_dir(qwen_dir, use_hf_tokenizer=True)


def test_hf_tokenizer_loads_specials_and_eos_list(qwen: ServingTokenizer, qwen_dir: Path) -> None:
    vocab = json.loads((qwen_dir / "tokenizer.json").read_text())["model"]["vocab"]
    im_end, eot = vocab["<|im_end|>"], vocab["<|endoftext|>"]
    assert qwen.eos_token_ids == [im_end, eot]  # generation_config.json's list, in order
    assert qwen.bos_token_id is None  # Qwen has no bos_token: nothing is prepended
    assert {im_end, eot, vocab["<|im_start|>"]} <= qwen.special_token_ids
    assert qwen.vocab_size == 700
    assert qwen.encode("a<|im_end|>b") == qwen.encode("a") + [im_end] + qwen.encode("b")
    assert qwen.decode(qwen.encode("<|im_start|>hi<|im_end|>")) == "hi"  # specials skipped


@pytest.mark.parametrize("text", [CJK_EMOJI, " two  spaces\n\ttab", "Hello world, 你好 🎉!"])
def test_hf_round_trip_and_token_bytes(qwen: ServingTokenizer, text: str) -> None:
    ids = qwen.encode(text)
    assert qwen.decode(ids) == text
    # logprobs' bytes: byte-level pieces ('Ġ' = space, 'ä½' = UTF-8 bytes) map back exactly
    assert b"".join(qwen.token_bytes(i) for i in ids) == text.encode()
    assert qwen._tok.convert_ids_to_tokens(qwen.encode(" ")[0]) == "Ġ"
    assert qwen.token_bytes(qwen.encode(" ")[0]) == b" "


def test_hf_ids_equal_transformers(qwen: ServingTokenizer, qwen_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    for text in (CJK_EMOJI, "<|im_start|>user\nHi<|im_end|>\n", "  x  y "):
        assert qwen.encode(text) == ref.encode(text, add_special_tokens=False)
        ids = qwen.encode(text)
        assert qwen.decode(ids) == ref.decode(ids, skip_special_tokens=True)


def test_default_stays_paddlenlp(qwen_dir: Path) -> None:
    tok = ServingTokenizer.from_model_dir(qwen_dir)
    assert type(tok._tok).__name__ == "Qwen2Tokenizer"
    assert tok.eos_token_ids[:2] == ServingTokenizer.from_model_dir(qwen_dir, True).eos_token_ids


def test_paddlenlp_keeps_added_tokens_whole(qwen_dir: Path, qwen: ServingTokenizer) -> None:
    """qwen_dir lists <|im_start|> in added_tokens_decoder only (no additional_special_tokens):
    PaddleNLP's Qwen2Tokenizer alone splits it into '<', '|', 'im', ... and strips the newline
    between <|im_end|> and <|im_start|> (its default for special tokens); served, a ChatML prompt
    encodes to the ids tokenizer.json gives."""
    tok = ServingTokenizer.from_model_dir(qwen_dir)
    vocab = json.loads((qwen_dir / "tokenizer.json").read_text())["model"]["vocab"]
    prompt = "<|im_start|>user\n你好 🎉<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(prompt)[0] == vocab["<|im_start|>"]
    assert tok.encode(prompt) == qwen.encode(prompt)
    assert tok.encode("a<|im_start|>b") == tok.encode("a") + [vocab["<|im_start|>"]] + tok.encode("b")


def test_missing_or_invalid_tokenizer_json(qwen_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "m"
    shutil.copytree(qwen_dir, bad)
    (bad / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="USE_HF_TOKENIZER=1 needs .*tokenizer.json"):
        ServingTokenizer.from_model_dir(bad, use_hf_tokenizer=True)
    for content in ("{not json", json.dumps({"model": {"type": "NoSuchModel"}})):
        (bad / "tokenizer.json").write_text(content)
        with pytest.raises(ValueError, match="not a valid HuggingFace tokenizer.json") as e:
            ServingTokenizer.from_model_dir(bad, use_hf_tokenizer=True)
        assert "\n" not in str(e.value)


def test_eos_list_stops_generation_at_either(qwen: ServingTokenizer) -> None:
    """generation_config.json's two eos ids reach the engine; each one alone ends a request."""
    from spmd_serve.sampling_params import SamplingParams
    from spmd_serve.scheduler.request import Request

    eos = frozenset(qwen.eos_token_ids)
    assert len(eos) == 2
    for stop_id in sorted(eos):

        def fn(prompt, pos, stop_id=stop_id):  # the model emits this eos as its 3rd token
            return stop_id if pos - len(prompt) == 2 else default_fn(prompt, pos)

        r = Request(f"r{stop_id}", [5, 6, 7], SamplingParams(max_tokens=10), eos_token_ids=eos)
        run(make_scheduler(), {0: [r]}, fn=fn)
        assert r.finish_reason == "stop" and r.output_token_ids[-1] == stop_id
        assert len(r.output_token_ids) == 3


def test_eos_single_int_and_config_fallback(qwen_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(qwen_dir, d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    (d / "config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert ServingTokenizer.from_model_dir(d, True).eos_token_ids[:2] == [7, 8]


# ---- chat templates -----------------------------------------------------------------------


def _hf_reference(model_dir: Path, messages: list[dict], add_generation_prompt: bool = True) -> str:
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    return ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


# (PaddleNLP has no PreTrainedTokenizerFast, so the Llama-3 directory is only read with
# USE_HF_TOKENIZER=1; Llama-3's template on PaddleNLP's tokenizer is the next test.)
@pytest.mark.parametrize("flavour,use_hf", [("qwen2", True), ("qwen2", False), ("llama3", True)])
def test_template_renders_as_transformers(flavour: str, use_hf: bool, qwen_dir: Path, llama3_dir: Path) -> None:
    d = qwen_dir if flavour == "qwen2" else llama3_dir
    tok = ServingTokenizer.from_model_dir(d, use_hf_tokenizer=use_hf)
    for msgs in (CHAT, CHAT[1:], CHAT[:2]):
        assert tok.render_chat(msgs) == _hf_reference(d, msgs)
    assert tok.render_chat(CHAT[1:], system="Be nice.") == _hf_reference(
        d, [{"role": "system", "content": "Be nice."}] + CHAT[1:]
    )


@pytest.mark.parametrize("flavour", ["qwen2", "llama3"])
def test_generation_prompt_off_and_continuing_the_final_message_render_as_transformers(
    flavour: str, qwen_dir: Path, llama3_dir: Path
) -> None:
    """vLLM's add_generation_prompt false and continue_final_message (the reply continues the last
    message: the template's end of turn after it cut), as transformers renders them."""
    transformers = pytest.importorskip("transformers")
    d = qwen_dir if flavour == "qwen2" else llama3_dir
    ours, ref = (
        ServingTokenizer.from_model_dir(d, use_hf_tokenizer=True),
        transformers.AutoTokenizer.from_pretrained(str(d)),
    )
    prefill = [*CHAT, {"role": "assistant", "content": "  The answer is "}]
    for msgs in (CHAT, prefill):
        assert ours.render_chat(msgs, add_generation_prompt=False) == ref.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=False
        )
    want = ref.apply_chat_template(prefill, tokenize=False, continue_final_message=True)
    assert ours.render_chat(prefill, continue_final_message=True) == want and want.endswith("The answer is")
    empty = [*CHAT, {"role": "assistant", "content": " "}]
    with pytest.raises(ValueError, match="the final message is empty"):
        ours.render_chat(empty, continue_final_message=True)


@pytest.mark.parametrize("template", [QWEN2_TEMPLATE, LLAMA3_TEMPLATE])
def test_template_renders_as_paddlenlp(template: str, demo_checkpoint: Path, qwen_dir: Path, tmp_path: Path) -> None:
    """PaddleNLP's own apply_chat_template: the demo Llama (SentencePiece) tokenizer carrying a
    real checkpoint's template, and PaddleNLP's Qwen2Tokenizer on the byte-level directory."""
    from paddlenlp.transformers import AutoTokenizer

    dirs = [qwen_dir] if template is QWEN2_TEMPLATE else []
    d = tmp_path / "demo"
    shutil.copytree(demo_checkpoint, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    for model_dir in dirs + [d]:
        ours = ServingTokenizer.from_model_dir(model_dir)
        ref = AutoTokenizer.from_pretrained(str(model_dir))
        for msgs in (CHAT, CHAT[1:]):
            assert ours.render_chat(msgs) == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_hf_template_conventions(llama3_dir: Path, tmp_path: Path) -> None:
    """tojson (not HTML-escaped, non-ASCII kept), loop controls, strftime_now, tools=None."""
    d = tmp_path / "m"
    shutil.copytree(llama3_dir, d)
    (d / "chat_template.jinja").write_text(FEATURES_TEMPLATE)  # overrides tokenizer_config's
    tok = ServingTokenizer.from_model_dir(d, use_hf_tokenizer=True)
    msgs = CHAT + [{"role": "user", "content": "STOP"}, {"role": "user", "content": "unseen"}]
    out = tok.render_chat(msgs)
    assert out == _hf_reference(d, msgs)
    assert '"<b>bold</b>' not in out and "你好 🎉" in out and "unseen" not in out
    assert out.endswith("]<|eot_id|><gen>")


def test_named_template_list_and_errors(llama3_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(llama3_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())

    def with_template(value) -> None:
        (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": value}))

    with_template([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}])
    assert ServingTokenizer.from_model_dir(d, True).render_chat(CHAT) == "D"
    with_template([{"name": "tool_use", "template": "T"}])
    with pytest.raises(ValueError, match="without a 'default' one"):
        ServingTokenizer.from_model_dir(d, True)
    with_template("{% for m in messages %}{{ m.content }")
    with pytest.raises(ValueError, match=r"invalid chat_template: .*\(template line 1\)"):
        ServingTokenizer.from_model_dir(d, True)
    with_template("{{ raise_exception('only user turns') }}")
    with pytest.raises(ValueError, match="chat template rejected the messages: only user turns"):
        ServingTokenizer.from_model_dir(d, True).render_chat(CHAT)


def test_chat_template_kwargs_reach_the_template_as_transformers_passes_them(tmp_path: Path) -> None:
    """vLLM's chat_template_kwargs (Qwen3's enable_thinking): the request's ids are those of
    transformers' apply_chat_template with the same variables; a variable the request's own fields set
    is refused by name."""
    from spmd_serve.frontend.common.parsing import Limits
    from spmd_serve.frontend.openai.body import OpenAIError
    from spmd_serve.frontend.openai.protocol import parse_openai
    from tests.support.hf_tokenizer_dirs import QWEN2_TEMPLATE

    transformers = pytest.importorskip("transformers")
    thinking = "{%- if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}"
    template = QWEN2_TEMPLATE + thinking + "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    model = write_byte_level_dir(tmp_path / "qwen3ish", "qwen2", extra_config={"chat_template": template})
    tok, ref = ServingTokenizer.from_model_dir(model, True), transformers.AutoTokenizer.from_pretrained(str(model))
    msgs = [{"role": "user", "content": "Hi"}]
    limits = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)

    def ids(**body: object) -> list[int]:
        return parse_openai("chat", {"model": "m", "messages": msgs, **body}, tok, limits, ("m",)).prompts[0]

    off = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert "</think>" in off and ids(chat_template_kwargs={"enable_thinking": False}) == tok.encode(off)
    plain = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ids(chat_template_kwargs={"enable_thinking": True}) == ids() == tok.encode(plain) != tok.encode(off)
    for bad, param in [({"tools": []}, "chat_template_kwargs.tools"), ([1], "chat_template_kwargs")]:
        with pytest.raises(OpenAIError) as e:
            ids(chat_template_kwargs=bad)
        assert e.value.param == param
    # OpenAI's reasoning_effort (vLLM's rule): the switch on unless "none"; the request's own variables win
    assert ids(reasoning_effort="none") == tok.encode(off) and ids(reasoning_effort="high") == tok.encode(plain)
    assert ids(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}) == tok.encode(plain)
    with pytest.raises(OpenAIError) as e:
        ids(reasoning_effort="extreme")
    assert e.value.param == "reasoning_effort" and "must be one of none, minimal" in e.value.msg
    plain_model = write_byte_level_dir(tmp_path / "qwen2", "qwen2", extra_config={"chat_template": QWEN2_TEMPLATE})
    with pytest.raises(OpenAIError) as e:  # (a template without a switch: it would change nothing)
        parse_openai("chat", {"model": "m", "messages": msgs, "reasoning_effort": "low"},
                     ServingTokenizer.from_model_dir(plain_model, True), limits, ("m",))  # fmt: skip
    assert e.value.param == "reasoning_effort" and "reads no reasoning_effort" in e.value.msg
