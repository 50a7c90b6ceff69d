"""Property tests of incremental detokenisation for both tokenizer kinds: the demo SentencePiece
tokenizer (PaddleNLP, byte fallback) and a byte-level BPE tokenizer.json (USE_HF_TOKENIZER=1).

For any token sequence fed in any chunking: the deltas add up to decode(all ids), and a delta
holds U+FFFD only where the full text has one (a character is never emitted half-done)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spmd_serve.frontend.text.output_assembler import OutputAssembler
from spmd_serve.frontend.text.tokenizer import ServingTokenizer
from tests.support.hf_tokenizer_dirs import write_byte_level_dir

CJK_EMOJI = "你好，世界！🌍 Ünïcödé 😊 结束。🧪🧬 👍🏽 ☕️"
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def toks(demo_checkpoint: Path, tmp_path_factory) -> dict[str, ServingTokenizer]:
    qwen = write_byte_level_dir(tmp_path_factory.mktemp("hf") / "qwen2", "qwen2")
    return {
        "sentencepiece": ServingTokenizer.from_model_dir(demo_checkpoint),
        "byte_level": ServingTokenizer.from_model_dir(qwen, use_hf_tokenizer=True),
    }


def _byte_ids(tok: ServingTokenizer) -> list[int]:
    """Ids whose piece is a single byte that is not a whole character (the hard case)."""
    return [i for i in range(tok.vocab_size) if len(b := tok.token_bytes(i)) == 1 and b[0] >= 0x80]


def _stream(tok: ServingTokenizer, ids: list[int], chunks: list[int]) -> list[str]:
    detok = tok.detokenizer([])
    deltas, i = [], 0
    for n in chunks:
        if i >= len(ids):
            break
        deltas.append(detok.step(ids[i : i + n]))
        i += n
    if i < len(ids):
        deltas.append(detok.step(ids[i:]))
    deltas.append(detok.flush())
    return deltas


def _check(tok: ServingTokenizer, ids: list[int], deltas: list[str]) -> None:
    full = tok.decode(ids)
    assert "".join(deltas) == full, ids
    for d in deltas:
        d.encode("utf-8")  # no lone surrogates either
        if "\ufffd" not in full:
            assert "\ufffd" not in d, ids


@pytest.mark.parametrize("kind", ["sentencepiece", "byte_level"])
@SETTINGS
@given(data=st.data())
def test_random_ids_any_chunking(toks, kind: str, data) -> None:
    tok = toks[kind]
    pool = st.one_of(st.sampled_from(_byte_ids(tok)), st.integers(0, tok.vocab_size - 1))
    ids = data.draw(st.lists(pool, min_size=1, max_size=40))
    chunks = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=40))
    _check(tok, ids, _stream(tok, ids, chunks))


def _continuation(tok: ServingTokenizer, prompt: list[int], ids: list[int]) -> str:
    """What a continuing detokenizer must produce: the output's text after the prompt's last few
    ordinary ids, those ending inside a character left out (their text is not the output's)."""
    seed = [i for i in prompt if i not in tok.special_token_ids][-5:]
    while seed and tok.decode(seed).endswith("\ufffd"):
        seed.pop()
    seed_text, full = tok.decode(seed), tok.decode(seed + ids)
    assert full.startswith(seed_text), (prompt, ids)  # the seed's text is never rewritten
    return full[len(seed_text) :]


@pytest.mark.parametrize("kind", ["sentencepiece", "byte_level"])
@SETTINGS
@given(data=st.data())
def test_a_continued_prompt_never_holds_the_answer_back(toks, kind: str, data) -> None:
    """OpenAI completions continue the prompt's text: for any prompt (byte pieces included, so it
    may end inside a character) and output, in any chunking, the deltas add up to the output's
    text after the prompt's; every character of the output that is whole is emitted."""
    tok = toks[kind]
    pool = st.one_of(st.sampled_from(_byte_ids(tok)), st.integers(0, tok.vocab_size - 1))
    prompt = data.draw(st.lists(pool, min_size=1, max_size=12))
    ids = data.draw(st.lists(pool, min_size=1, max_size=30))
    chunks = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=30))
    detok, deltas, i = tok.detokenizer(prompt, continue_prompt=True), [], 0
    for n in chunks + [len(ids)]:
        deltas.append(detok.step(ids[i : i + n]))
        i += n
    deltas.append(detok.flush())
    assert "".join(deltas) == _continuation(tok, prompt, ids), (prompt, ids)


def test_a_prompt_ending_inside_a_character_keeps_the_answer(toks) -> None:
    """The served case (a benchmark's random prompt): the prompt ends with two of a character's
    three byte pieces and the answer starts with the third, then words.  The answer used to be
    held back whole (an empty completion of 128 tokens); now its words stream."""
    tok = toks["sentencepiece"]
    byte_id = {tok.token_bytes(i)[0]: i for i in _byte_ids(tok)}
    e3, x81, x82 = byte_id[0xE3], byte_id[0x81], byte_id[0x82]  # "あ" byte by byte
    words = tok.encode("to enter the house")
    prompt = tok.encode("Hello world") + [e3, x81]
    detok = tok.detokenizer(prompt, continue_prompt=True)
    streamed = [detok.step([t]) for t in [x82, *words]] + [detok.flush()]
    assert "".join(streamed) == tok.decode([x82, *words]) == "\ufffd to enter the house"  # the stray byte too
    assert streamed[1] != ""  # not held back


@pytest.mark.parametrize("kind", ["sentencepiece", "byte_level"])
@SETTINGS
@given(
    # no literal U+FFFD: the detokenizer cannot tell one from a character's first bytes, so it holds
    # one back like those (test_a_literal_replacement_char_is_held_back_but_never_lost)
    text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\ufffd"), max_size=30)
    | st.sampled_from([CJK_EMOJI, " leading space", "a  b\n 你 🎉"])
)
def test_valid_text_streams_without_replacement_chars(toks, kind: str, text: str) -> None:
    tok = toks[kind]
    ids = tok.encode(text)
    if tok.decode(ids) != text:  # SentencePiece normalises some inputs (e.g. NFKC); skip those
        return
    deltas = _stream(tok, ids, [1] * len(ids))
    assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)
    assert deltas[-1] == ""  # nothing was left held back


@pytest.mark.parametrize("kind", ["sentencepiece", "byte_level"])
@pytest.mark.parametrize("text", ["\ufffd", "a\ufffdb", "x \ufffd", "\ufffd\ufffd 你"])
def test_a_literal_replacement_char_is_held_back_but_never_lost(toks, kind: str, text: str) -> None:
    """A U+FFFD the model really writes looks like a character's first bytes: it waits for the next
    delta that does not end in one, or for the end, and comes out whole (found by the property above
    when its alphabet still had U+FFFD)."""
    tok = toks[kind]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    deltas = _stream(tok, ids, [1] * len(ids))
    assert "".join(deltas) == text
    assert all(not d.endswith("\ufffd") for d in deltas[:-1])  # before the end, never a trailing one


@pytest.mark.parametrize("kind", ["sentencepiece", "byte_level"])
def test_output_assembler_frames_cjk_emoji(toks, kind: str) -> None:
    """What the front ends send per engine step: each frame valid UTF-8 text, the frames joined
    equal to the non-streaming text, while the ids spell CJK/emoji byte by byte."""
    tok = toks[kind]
    ids = tok.encode(CJK_EMOJI)
    assert any(len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80 for i in ids)
    asm = OutputAssembler(tok.detokenizer([]), ())
    frames = [asm.add([i], finished=n == len(ids) - 1) for n, i in enumerate(ids)]
    assert "".join(frames) == CJK_EMOJI == tok.decode(ids)
    assert all("\ufffd" not in f for f in frames)
    assert sum(1 for f in frames if f == "") > 0  # the partial characters were held back
