"""Tests for spmd_serve.frontend.text.tokenizer (ServingTokenizer) and .detokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from spmd_serve.export.demo.checkpoint import write_demo_checkpoint
from spmd_serve.export.demo.corpus import sample_texts
from spmd_serve.frontend.text.tokenizer import ServingTokenizer

ROUND_TRIP = [
    "Hello, world! 2 + 2 = 4.",
    "  two leading spaces, double  inner, trailing \n\tnew line and tab\n",
    "今天天气很好，我们去公园散步吧。",
    "Emoji: 🎉🍕☕️ 👍🏽 and 🧪 (rare ones fall back to bytes)",
    "Mixed 中文 text with ümlaut, π ≈ 3.14159 and ∞.",
]
CJK_EMOJI = "你好，世界！🌍 Ünïcödé test 😊 结束。🧪🧬"


@pytest.fixture(scope="session")
def tok(tmp_path_factory: pytest.TempPathFactory) -> ServingTokenizer:
    ckpt = write_demo_checkpoint(tmp_path_factory.mktemp("demo") / "tiny", "tiny", seed=0)
    return ServingTokenizer.from_model_dir(ckpt)


def test_loaded_paddlenlp_llama_tokenizer(tok: ServingTokenizer) -> None:
    assert type(tok._tok).__name__ == "LlamaTokenizer"
    assert tok.eos_token_ids == [2] and tok.bos_token_id == 1
    assert tok.has_chat_template and tok.vocab_size == 1024


def test_missing_dir_is_not_a_hub_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ServingTokenizer.from_model_dir(tmp_path / "nope")


@pytest.mark.parametrize("text", ROUND_TRIP + sample_texts())
def test_round_trip(tok: ServingTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert 0 not in ids and 1 not in ids  # no <unk>, no BOS added
    assert tok.decode(ids) == text


def test_byte_fallback_used_for_rare_chars(tok: ServingTokenizer) -> None:
    pieces = tok._tok.convert_ids_to_tokens(tok.encode("🧪"))
    assert pieces[-4:] == ["<0xF0>", "<0x9F>", "<0xA7>", "<0xAA>"]


def test_decode_skips_special_and_matches_paddlenlp(tok: ServingTokenizer) -> None:
    assert tok.decode([1] + tok.encode("hi there") + [2]) == "hi there"
    rng = random.Random(0)
    for _ in range(200):  # the sentencepiece fast path must equal PaddleNLP's own decode
        ids = [rng.randrange(1024) for _ in range(rng.randint(1, 30))]
        assert tok.decode(ids) == tok._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


THREE = [
    {"role": "user", "content": "Hi!"},
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2+2?"},
]


def test_chat_template_any_role_order(tok: ServingTokenizer) -> None:
    assert tok.render_chat(THREE) == (
        "<s><|user|>\nHi!<|end|>\n<|system|>\nAnswer briefly.<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"
    )


def test_chat_system_field_and_parts(tok: ServingTokenizer) -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c"},
    ]
    out = tok.render_chat(msgs, system="S")
    assert out == ("<s><|system|>\nS<|end|>\n<|user|>\na\nb<|end|>\n<|assistant|>\nc<|end|>\n<|assistant|>\n")


def test_message_keys_reach_the_template(tok: ServingTokenizer) -> None:
    named = [{"role": "user", "content": "hi", "name": "bob"}]
    assert tok.render_chat(named) == tok.render_chat([{"role": "user", "content": "hi"}])  # unused: no change
    uses = ServingTokenizer(tok._tok, "{% for m in messages %}{{ m.name }}: {{ m.content }}|{% endfor %}", [2], 1)
    assert uses.render_chat(named + [{"role": "user", "content": [{"type": "text", "text": "x"}]}]) == "bob: hi|: x|"


def test_an_assistant_turn_that_only_thought_has_empty_content(tok: ServingTokenizer) -> None:
    """Content null (this server's answer when it was all thinking) on an assistant turn: "" to the
    template, its reasoning_content as it came; null content on any other turn stays refused."""
    uses = ServingTokenizer(tok._tok, "{% for m in messages %}{{ m.role }}[{{ m.reasoning_content }}]{{ m.content }}|"
                            "{% endfor %}", [2], 1)  # fmt: skip
    thought = {"role": "assistant", "content": None, "reasoning_content": "hm"}
    turns = [{"role": "user", "content": "hi"}, thought, {"role": "user", "content": "go on"}]
    assert uses.render_chat(turns) == "user[]hi|assistant[hm]|user[]go on|"
    assert uses.render_chat([turns[0], {"role": "assistant"}]) == "user[]hi|assistant[]|"
    with pytest.raises(ValueError, match=r"messages\[0\]\.content is missing"):
        uses.render_chat([{"role": "system", "content": None}])


def test_encode_prompt(tok: ServingTokenizer) -> None:
    ids = tok.encode_prompt(text="Hello")
    assert ids == tok.encode(tok.render_chat([{"role": "user", "content": "Hello"}]))
    assert ids[0] == 1 and ids.count(1) == 1  # exactly one BOS, from the template
    assert 4 in ids and ids[-2:] == [5, tok.encode("\n")[-1]]  # <|user|> ... <|assistant|>\n
    assert tok.encode_prompt(messages=THREE) == tok.encode(tok.render_chat(THREE))
    plain = ServingTokenizer(tok._tok, None, [2], 1)
    assert not plain.has_chat_template
    # without a template: the tokenizer's own special tokens (issue 17; the original tool's
    # add_special_tokens), and the demo's tokenizer_config.json says add_bos_token: false
    assert plain.encode_prompt(text="Hello") == tok.encode("Hello", add_special_tokens=True) == tok.encode("Hello")
    with pytest.raises(ValueError, match="no chat template"):
        plain.encode_prompt(messages=THREE)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"messages": "hi"},
        {"messages": ["hi"]},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": 3, "content": "x"}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": None}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
        {"messages": [{"role": "tool", "content": "x"}]},  # rejected by the template itself
        {"messages": []},
        {"messages": [{"role": "user", "content": "x"}], "system": 7},
        {"text": "a", "messages": [{"role": "user", "content": "x"}]},
        {},
        {"text": 12},
    ],
)
def test_bad_requests_raise_value_error(tok: ServingTokenizer, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        tok.encode_prompt(**kwargs)


def test_template_is_sandboxed(tok: ServingTokenizer) -> None:
    evil = ServingTokenizer(tok._tok, "{{ ''.__class__.__mro__ }}", [2], 1)
    with pytest.raises(ValueError, match="unsafe"):
        evil.render_chat([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="invalid chat_template"):
        ServingTokenizer(tok._tok, "{% for %}", [2], 1)


def _stream(tok: ServingTokenizer, ids: list[int], rng: random.Random) -> list[str]:
    """Feed ids in random chunk sizes (1-3 per step, like speculative/multi-token steps)."""
    detok = tok.detokenizer([1, 2, 3])
    deltas, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 3)
        deltas.append(detok.step(ids[i : i + n]))
        i += n
    deltas.append(detok.flush())
    assert detok.text == "".join(deltas)
    return deltas


def test_detokenizer_random_sequences(tok: ServingTokenizer) -> None:
    rng = random.Random(1234)
    byte_ids = list(range(7, 263))  # byte-fallback pieces: the hard case for partial chars
    for trial in range(400):
        pool = byte_ids if trial % 3 == 0 else range(1024)
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 60))]
        if trial % 5 == 0:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice([0, 1, 2]))  # specials inside
        assert "".join(_stream(tok, ids, rng)) == tok.decode(ids), ids


@pytest.mark.parametrize("text", [CJK_EMOJI, " leading space", "Hello world, 你好 🎉!"] + ROUND_TRIP)
def test_detokenizer_text_no_partial_chars(tok: ServingTokenizer, text: str) -> None:
    ids = tok.encode(text)
    detok = tok.detokenizer([])
    deltas = [detok.step([i]) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    assert deltas[-1] == ""  # nothing was left held back for valid text


def test_detokenizer_holds_back_then_flushes(tok: ServingTokenizer) -> None:
    ids = tok.encode("a🧪")
    detok = tok.detokenizer([])
    head = [detok.step([i]) for i in ids[:-1]]
    assert "".join(head) == "a"  # the 3 bytes of 🧪 so far are held back
    assert detok.step(ids[-1:]) == "🧪"
    # Holding back is per step: a step whose text ends inside a character emits nothing.
    whole = tok.detokenizer([])
    assert whole.step(ids[:-1]) == "" and whole.step(ids[-1:]) == "a🧪"
    unfinished = tok.detokenizer([])
    for i in ids[:-1]:
        unfinished.step([i])
    assert unfinished.text == "a" and unfinished.flush().startswith("\ufffd")
