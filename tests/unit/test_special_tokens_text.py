"""vLLM's `skip_special_tokens: false` (and `spaces_between_special_tokens`): the text written for
special tokens, streamed and whole.

The rule (frontend.text.detokenizer.join_with_specials): the output cut at each special token, each
run between decoded as before, each special token as its own string, joined by a space (or nothing
with spaces_between_special_tokens false); tokenizer.json's tokenizers put no spaces (HF's fast
rule, which vLLM follows).  Checked against the tokenizers' own decode where they follow the same
rule: PaddleNLP's Qwen2Tokenizer (a slow tokenizer: its `_decode` joins added tokens with spaces)
and transformers' fast tokenizer on the same tokenizer.json.  The demo's PaddleNLP LlamaTokenizer
writes its own way (a space before the first special token, none after), which vLLM does not
follow either: there the rule is checked by the streaming property alone.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spmd_serve.frontend.text.output_assembler import OutputAssembler
from spmd_serve.frontend.text.tokenizer import ServingTokenizer
from tests.support.hf_tokenizer_dirs import write_byte_level_dir

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    return write_byte_level_dir(tmp_path_factory.mktemp("hf") / "qwen2", "qwen2")


@pytest.fixture(scope="module")
def toks(demo_checkpoint: Path, qwen_dir: Path) -> dict[str, ServingTokenizer]:
    return {
        "sentencepiece": ServingTokenizer.from_model_dir(demo_checkpoint),
        "paddlenlp_bpe": ServingTokenizer.from_model_dir(qwen_dir),
        "tokenizer_json": ServingTokenizer.from_model_dir(qwen_dir, use_hf_tokenizer=True),
    }


def _random_ids(tok: ServingTokenizer, rng: random.Random) -> list[int]:
    specials = sorted(tok.special_token_ids)
    n = rng.randint(1, 25)
    return [rng.choice(specials) if rng.random() < 0.25 else rng.randrange(tok.vocab_size) for _ in range(n)]


def test_demo_tokenizer_writes_specials_between_spaces(toks) -> None:
    tok = toks["sentencepiece"]
    ids = [1, *tok.encode("Hello world"), 2, *tok.encode("again"), 2, 2]
    assert tok.decode(ids) == "Hello world again"  # the default: skipped
    assert tok.decode(ids, skip_special_tokens=False) == "<s> Hello world </s> again </s> </s>"
    assert tok.decode(ids, False, spaces_between_special_tokens=False) == "<s>Hello world</s>again</s></s>"


@pytest.mark.parametrize("spaces", [True, False])
def test_paddlenlp_slow_tokenizer_decode_is_the_rule(toks, spaces: bool) -> None:
    tok = toks["paddlenlp_bpe"]
    assert type(tok._tok).__name__ == "Qwen2Tokenizer"
    rng = random.Random(1)
    for _ in range(200):
        ids = _random_ids(tok, rng)
        ref = tok._tok.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False, spaces_between_special_tokens=spaces
        )
        assert tok.decode(ids, False, spaces) == ref, ids


@pytest.mark.parametrize("spaces", [True, False])
def test_tokenizer_json_decode_equals_transformers_fast(toks, qwen_dir: Path, spaces: bool) -> None:
    """No spaces put around special tokens, whatever spaces_between_special_tokens says (HF's fast
    tokenizers and so vLLM ignore it)."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    tok = toks["tokenizer_json"]
    rng = random.Random(2)
    for _ in range(200):
        ids = _random_ids(tok, rng)
        want = ref.decode(ids, skip_special_tokens=False, spaces_between_special_tokens=spaces)
        assert tok.decode(ids, False, spaces) == want, ids


@pytest.mark.parametrize("kind", ["sentencepiece", "paddlenlp_bpe", "tokenizer_json"])
@pytest.mark.parametrize("spaces", [True, False])
@SETTINGS
@given(data=st.data())
def test_streamed_specials_add_up_to_the_whole_text(toks, kind: str, spaces: bool, data) -> None:
    """Any ids (special ones often, byte pieces included), any chunking, after any prompt: the
    deltas add up to decode(ids, skip_special_tokens=False) (after the prompt's text when continuing
    it), and no delta holds U+FFFD the whole text lacks."""
    tok = toks[kind]
    pool = st.one_of(st.sampled_from(sorted(tok.special_token_ids)), st.integers(0, tok.vocab_size - 1))
    ids = data.draw(st.lists(pool, min_size=1, max_size=30))
    chunks = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=30))
    prompt = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=6))
    cont = bool(prompt) and data.draw(st.booleans())
    detok = tok.detokenizer(prompt, cont, skip_special_tokens=False, spaces_between_special_tokens=spaces)
    deltas, i = [], 0
    for n in chunks + [len(ids)]:
        deltas.append(detok.step(ids[i : i + n]))
        i += n
    deltas.append(detok.flush())
    whole = tok.decode(ids, False, spaces)
    if cont:  # the first run continues the prompt's text (as with special tokens skipped)
        first = next((k for k, t in enumerate(ids) if t in tok.special_token_ids), len(ids))
        head = tok.detokenizer(prompt, True, spaces_between_special_tokens=spaces)
        run = head.step(ids[:first]) + head.flush()
        whole = run + whole[len(tok.decode(ids[:first], True, spaces)) :]
    assert "".join(deltas) == whole, (prompt, ids)
    if "\ufffd" not in whole:
        assert not any("\ufffd" in d for d in deltas)


def _assemble(tok, ids, finished_by: str, include: bool = False, skip: bool = False) -> str:
    detok = tok.detokenizer([], False, skip_special_tokens=skip)
    hidden = frozenset() if include or skip else frozenset(tok.eos_token_ids)
    asm = OutputAssembler(detok, (), include, hidden)
    return "".join(asm.add([t], k == len(ids) - 1, finished_by == "stop") for k, t in enumerate(ids))


def test_the_eos_that_stopped_the_request_is_written_only_when_kept(toks) -> None:
    """vLLM's rule: the token that stopped generation leaves no text unless
    include_stop_str_in_output; an eos generated under ignore_eos (or ending at the length limit)
    is text like any special token."""
    tok = toks["sentencepiece"]
    hi = tok.encode("hi")
    assert _assemble(tok, [*hi, 2, *hi, 2], "stop") == "hi </s> hi"
    assert _assemble(tok, [*hi, 2, *hi, 2], "stop", include=True) == "hi </s> hi </s>"
    assert _assemble(tok, [*hi, 2, *hi, 2], "length") == "hi </s> hi </s>"
    assert _assemble(tok, [*hi, 2, *hi, 2], "stop", skip=True) == "hi hi"
