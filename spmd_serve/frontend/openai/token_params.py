"""The OpenAI request fields that name token ids — vLLM's `stop_token_ids` and `allowed_token_ids`,
and OpenAI's `logit_bias` — read from a body: their shapes and bounds, and every id checked against
the vocabulary; and vLLM's `bad_words` and `guided_choice`, turned into token ids.  Each refusal is a `FieldError`
naming the field (openai.protocol answers it as a 400)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spmd_serve.engine import gbnf_grammar, json_patterns
from spmd_serve.frontend.common.parsing import ProtocolError, check_in_vocab, finite_number, is_int, show
from spmd_serve.frontend.openai.fields import FieldError, given_once
from spmd_serve.sampling_params import (
    INT32_MAX,
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    MAX_CHOICE_TOKENS,
    MAX_CHOICES,
    MAX_LOGIT_BIAS,
    MAX_SCHEMA_CHARS,
)

Slow = list[Callable[[], object]]  # work that may take long (a grammar's compile): run off the IO loop
_STRUCTURED = (
    "choice",
    "json",
    "json_object",
    "regex",
    "grammar",
    "structural_tag",
    "disable_any_whitespace",
    "whitespace_pattern",
)  # later vLLM's structured_outputs that are built


def _in_vocab(name: str, ids: list[int], tokenizer: Any) -> None:
    try:
        check_in_vocab(name, ids, getattr(tokenizer, "vocab_size", None))
    except ProtocolError as e:
        raise FieldError(e.msg, name) from None


def _ids(body: dict[str, Any], name: str, tokenizer: Any, want: str, min_size: int = 0) -> list[int] | None:
    """body[name] as a list of token ids below the vocabulary size (None when absent)."""
    ids = body.get(name)
    if ids is None:
        return None
    if not isinstance(ids, list) or len(ids) < min_size or not all(is_int(i) and 0 <= i <= INT32_MAX for i in ids):
        raise FieldError(f"{name} must be {want}, got {show(ids)}", name)
    _in_vocab(name, ids, tokenizer)
    return ids


def stop_token_ids(body: dict[str, Any], tokenizer: Any) -> tuple[int, ...]:
    """[id, ...] → the ids, each below the vocabulary size."""
    return tuple(_ids(body, "stop_token_ids", tokenizer, "a list of non-negative integers") or ())


def allowed_token_ids(body: dict[str, Any], tokenizer: Any) -> tuple[int, ...]:
    """vLLM's [id, ...] that the draw is limited to → the ids ascending and distinct (not empty)."""
    ids = _ids(body, "allowed_token_ids", tokenizer, "a non-empty list of token ids", min_size=1)
    return tuple(sorted(set(ids or ())))


def _token_id(key: Any) -> int | None:
    """A JSON object key that is a token id ("17"), else None; long digit strings are not (int()
    refuses more than 4,300 digits, and no vocabulary has 11)."""
    if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10):
        return None
    token = int(key)
    return token if token <= INT32_MAX else None


def logit_bias(body: dict[str, Any], tokenizer: Any) -> tuple[tuple[int, float], ...]:
    """{"<token id>": bias in [-100, 100]} → (id, bias) pairs, ids ascending and distinct."""
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise FieldError(f"logit_bias must be an object of token id -> bias, got {show(bias)}", "logit_bias")
    pairs: dict[int, float] = {}
    for key, value in bias.items():
        token = _token_id(key)
        if token is None:
            raise FieldError(f"logit_bias keys must be token ids (integers >= 0), got {show(key)}", "logit_bias")
        number = finite_number(value)
        if number is None or abs(number) > MAX_LOGIT_BIAS:
            raise FieldError(f"logit_bias[{key}] must be a number in [-100, 100], got {show(value)}", "logit_bias")
        if token in pairs:  # "7" and "07"
            raise FieldError(f"logit_bias names token {token} twice", "logit_bias")
        pairs[token] = number
    _in_vocab("logit_bias", list(pairs), tokenizer)
    return tuple(sorted(pairs.items()))


def bad_words(body: dict[str, Any], tokenizer: Any, allowed: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """vLLM's ["word", ...] → the token sequences to ban, as vLLM's SamplingParams.update_from_tokenizer
    makes them: each word's ids (leading spaces stripped), and also its ids after a space where
    that is as many ids and starts with another one (a word-initial piece of its own).  Refused
    when they ban each of the `allowed` token ids outright (nothing could be drawn)."""
    words = body.get("bad_words")
    if words is None:
        return ()
    if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
        raise FieldError(f"bad_words must be a list of non-blank strings, got {show(words)}", "bad_words")
    out: dict[tuple[int, ...], None] = {}  # distinct, in order
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip()))
        spaced = tuple(tokenizer.encode(" " + word.lstrip()))
        if not plain or not spaced:  # all of it normalised away
            raise FieldError(f"bad_words: {show(word)} has no tokens", "bad_words")
        for ids in (plain, spaced) if spaced[0] != plain[0] and len(spaced) == len(plain) else (plain,):
            if len(ids) > MAX_BAD_WORD_TOKENS:
                raise FieldError(f"bad_words: {show(word)} is more than {MAX_BAD_WORD_TOKENS} tokens", "bad_words")
            out[ids] = None
    if len(out) > MAX_BAD_WORDS:
        raise FieldError(f"bad_words makes {len(out)} token sequences to ban; at most {MAX_BAD_WORDS}", "bad_words")
    if allowed and set(allowed) <= {ids[0] for ids in out if len(ids) == 1}:
        raise FieldError("bad_words ban every token allowed_token_ids allows", "bad_words")
    return tuple(out)


def _choice_field(body: dict[str, Any]) -> tuple[Any, str]:
    """(the choices, the field that named them): vLLM's guided_choice, or the structured_outputs object
    of its later versions, of which only "choice" is built (the rest refused by name)."""
    outputs = body.get("structured_outputs")
    if outputs is None:
        return body.get("guided_choice"), "guided_choice"
    if not isinstance(outputs, dict):
        raise FieldError(f"structured_outputs must be an object, got {show(outputs)}", "structured_outputs")
    other = next((k for k, v in outputs.items() if k not in _STRUCTURED and v not in (None, False)), None)
    if other is not None:  # (its flags are false by default: false changes nothing)
        raise FieldError(
            f"structured_outputs.{other} is not supported by this server (only {', '.join(_STRUCTURED)})",
            f"structured_outputs.{other}",
        )
    if body.get("guided_choice") is not None:
        raise FieldError("guided_choice and structured_outputs cannot both be given", "structured_outputs")
    return outputs.get("choice"), "structured_outputs.choice"


def check_grammar(compile_: Callable[[], object], prefix: str, name: str, slow: Slow | None) -> None:
    """Compile a grammar now, or put that in `slow`: a FieldError naming `name` if it is refused."""

    def check() -> None:
        try:
            compile_()
        except (ValueError, RecursionError) as e:  # (JSONDecodeError is a ValueError)
            raise FieldError(f"{prefix}{str(e) or type(e).__name__}", name) from None

    if slow is None:
        check()
    else:
        slow.append(check)


def guided_regex(body: dict[str, Any], ends_on_eos: bool, other: str, slow: Slow | None = None) -> str:
    """vLLM's guided_regex (or structured_outputs' "regex"): the pattern the whole answer is one match
    of ("" for none; engine/json_patterns.answer_grammar).  Not with `other` (the structured output
    already given, if any), ignore_eos or min_tokens; a pattern not built is refused naming what
    (now, or by the check put in `slow` where that is given)."""
    return _guided_text(body, "regex", json_patterns.answer_grammar, ends_on_eos, other, slow)


def guided_grammar(body: dict[str, Any], ends_on_eos: bool, other: str, slow: Slow | None = None) -> str:
    """vLLM's guided_grammar (or structured_outputs' "grammar"): the GBNF (or Lark) grammar whose root rule the
    whole answer is one match of ("" for none; engine/gbnf_grammar.answer_grammar), as guided_regex."""
    return _guided_text(body, "grammar", gbnf_grammar.answer_grammar, ends_on_eos, other, slow)


def _guided_text(
    body: dict[str, Any], key: str, compile_: Callable[[str, str], object], ends_on_eos: bool, other: str,
    slow: Slow | None,
) -> str:  # fmt: skip
    """The text of guided_<key> or structured_outputs.<key> ("" for neither), checked by `compile_`."""
    outputs = body.get("structured_outputs")
    given = given_once(
        [
            (f"guided_{key}", body.get(f"guided_{key}")),
            (f"structured_outputs.{key}", outputs.get(key) if isinstance(outputs, dict) else None),
        ],
        other,
    )
    if given is None:
        return ""
    name, text = given
    if not isinstance(text, str) or len(text) > MAX_SCHEMA_CHARS:
        raise FieldError(f"{name} must be a string of at most {MAX_SCHEMA_CHARS} characters", name)
    if not ends_on_eos:
        raise FieldError(f"{name} ends the answer with an EOS: not with ignore_eos or min_tokens", name)
    check_grammar(lambda: compile_(text, name), "", name, slow)
    return text


def guided_choice(
    body: dict[str, Any], tokenizer: Any, prompts: list[list[int]], continues: bool, ends_on_eos: bool
) -> tuple[tuple[int, ...], ...]:
    """vLLM's ["answer", ...] → the token sequences the answer is held to: each answer's own ids,
    which must read back as exactly that answer after every prompt (`continues`: as its
    continuation), else a 400 naming it; for an answer with a leading space, also the ids of the
    rest (SentencePiece's word marker writes that space).  `ends_on_eos` false (ignore_eos,
    min_tokens) is refused, since an EOS ends the answer."""
    choices, name = _choice_field(body)
    if choices is None:
        return ()
    if not (
        isinstance(choices, list) and 0 < len(choices) <= MAX_CHOICES and all(isinstance(c, str) and c for c in choices)
    ):
        raise FieldError(f"{name} must be 1 to {MAX_CHOICES} non-empty strings, got {show(choices)}", name)
    if not ends_on_eos:
        raise FieldError(f"{name} ends the answer with an EOS: not with ignore_eos or min_tokens", name)
    out: dict[tuple[int, ...], None] = {}
    for choice in choices:
        spaced = [choice[1:]] if choice.startswith(" ") and choice[1:] else []
        candidates = [tuple(tokenizer.encode(text)) for text in (choice, *spaced)]
        readings = [_readings(ids, tokenizer, prompts, continues) for ids in candidates]
        exact = [ids for ids, texts in zip(candidates, readings) if texts == {choice}]
        if not exact:
            where = " after the prompt" if continues else ""
            raise FieldError(
                f"{name}: this model's tokens for {show(choice)} read {show(min(readings[0]))}{where}, not "
                "the answer itself", name,
            )  # fmt: skip
        if len(exact[0]) > MAX_CHOICE_TOKENS:
            raise FieldError(f"{name}: {show(choice)} is more than {MAX_CHOICE_TOKENS} tokens", name)
        out[exact[0]] = None
    return tuple(out)


def _readings(ids: tuple[int, ...], tokenizer: Any, prompts: list[list[int]], continues: bool) -> set[str]:
    """The texts `ids` read as an answer after each prompt, as the response will write them."""
    texts = set()
    for prompt in prompts:
        detok = tokenizer.detokenizer(prompt, continues)
        texts.add(detok.step(ids) + detok.flush())
    return texts
