"""Synthetic prompts of an exact token length, made from the served model's tokenizer.

Like vLLM's "random" dataset: token ids drawn uniformly from the ordinary (non-special) part of the
vocabulary with a seeded generator, so every run with the same `--seed` sends the same prompts.
Backends that accept token ids (OpenAI completions `prompt`, native `input_ids`, gRPC) send them
as they are, so the server sees exactly `--input-len` tokens.  Chat backends need text: the ids
are decoded, and re-encoding that text may give a slightly different count, and the chat template
adds its own tokens — the server's own prompt count (usage) is what the report uses then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Tokenizer(Protocol):
    """What this module needs of a tokenizer (ServingTokenizer, or the tests' fake)."""

    @property
    def vocab_size(self) -> int: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    text: str  # the ids decoded (what chat backends send)


def special_ids(tokenizer: Tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "special_token_ids", ()) or ())
    ids.update(getattr(tokenizer, "eos_token_ids", ()) or ())
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None:
        ids.add(int(bos))
    return ids


def synthetic_prompts(
    tokenizer: Tokenizer, num: int, input_len: int, seed: int = 0, id_range: tuple[int, int] | None = None
) -> list[Prompt]:
    """`num` prompts of exactly `input_len` ordinary token ids each.

    `id_range` = [lo, hi) narrows the ids drawn (the tests' character-level fake has a 1.1 M
    "vocabulary" of which only printable characters make sense)."""
    if input_len < 1 or num < 1:
        raise ValueError("--input-len and --num-prompts must be at least 1")
    lo, hi = id_range or (0, tokenizer.vocab_size)
    banned = special_ids(tokenizer)
    # Special ids (BOS/EOS/pad...) are excluded: an EOS inside a prompt could change what is measured.
    allowed = np.array([i for i in range(lo, min(hi, tokenizer.vocab_size)) if i not in banned], dtype=np.int64)
    if allowed.size == 0:
        raise ValueError("the tokenizer has no ordinary token ids to build prompts from")
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(num):
        ids = rng.choice(allowed, size=input_len).tolist()
        prompts.append(Prompt(ids, tokenizer.decode(ids)))
    return prompts


def load_tokenizer(model_dir: str) -> Tokenizer:
    """The served model's tokenizer, as the server loads it."""
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    tokenizer: Tokenizer = ServingTokenizer.from_model_dir(model_dir)  # vocab_size is a property there
    return tokenizer
