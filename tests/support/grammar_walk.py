"""A random writer for a byte grammar (engine/grammar_table.py): `walk` takes, byte by byte, any
byte the grammar allows (whitespace rarely) until the value is whole, and fails if it is ever left
with none (a stranded state).  What it writes is some answer the masks could let a model write.
`walk_to_end` stops where the grammar may end instead (a pattern's, a GBNF grammar's, a structural
tag's), and `mutants` gives near-misses of an answer."""

from __future__ import annotations

import functools
import random

import numpy as np

from spmd_serve.engine.grammar_table import DEAD, POP, RESUME, Grammar, complete

WHITESPACE = b" \n\t"


def walk(g: Grammar, rng: random.Random, max_bytes: int = 20000, close: float = 0.0) -> bytes:
    """Bytes chosen at random among those `g` allows from its start, until the value is whole;
    `close`: how often a closing bracket is taken where one may come (a recursive schema's walk
    then ends)."""
    state, out = g.start, b""
    while not complete(state):
        assert len(out) < max_bytes, f"no end after {out[:200]!r}..."
        ways = np.flatnonzero(g.table[state[0]] != DEAD).tolist()  # (the table's; a POP's way is the stack's)
        allowed = [b for b in ways if g.step(state, bytes([b])) is not None]
        assert allowed, f"stranded after {out!r}"
        plain = [b for b in allowed if b not in WHITESPACE] or allowed
        closing = [b for b in allowed if b in b"]}"]
        if closing and rng.random() < close:
            plain = closing
        b = rng.choice(plain if rng.random() < 0.95 else allowed)
        state, out = g.step(state, bytes([b])), out + bytes([b])
    return out


def walk_to_end(g: Grammar, rng: random.Random, stop: float = 0.15, limit: int = 200) -> bytes:
    """Bytes chosen at random among those `g` allows until it may end (and a draw says stop), past
    `limit` bytes mostly the byte nearest an end; fails if it is ever left with no way on and cannot
    end (a stranded state)."""
    left = _distances(g)
    state, out = g.start, b""
    while True:
        row = g.table[state[0]].tolist()
        ways = [b for b, t in enumerate(row) if t != DEAD and (t not in (POP, RESUME) or g.step(state, bytes([b])))]
        if g.may_end(state) and (not ways or rng.random() < stop or len(out) > limit):
            return out
        assert ways and len(out) < 50 * limit, f"stranded after {out!r}"
        if len(out) > limit and rng.random() < 0.8:
            ways = [min(ways, key=lambda b: _left(left, g.step(state, bytes([b]))))]
        b = rng.choice(ways)
        state, out = g.step(state, bytes([b])), out + bytes([b])


@functools.cache
def _distances(g: Grammar) -> list[float]:
    """Per table state, the fewest bytes to where the answer may end or the innermost bracket closes."""
    left = [0.0 if s in g.ends else float("inf") for s in range(len(g.table))]
    while True:
        new = [min([left[s]] + [_way(left, g, s, b, t) for b, t in enumerate(g.table[s].tolist()) if t != DEAD])
               for s in range(len(left))]  # fmt: skip
        if new == left:
            return left
        left = new


def _way(left: list[float], g: Grammar, s: int, b: int, t: int) -> float:
    """The fewest bytes to an end (or a close) by byte b from s (to t): a push's inside, then its return
    (an indentation run's end counts as a close: the byte is read again where it resumes)."""
    return 1 + (0 if t in (POP, RESUME) else left[t] + (left[g.pushes[s, b]] if g.pushes[s, b] else 0))


def _left(left: list[float], state) -> float:
    return left[state[0]] + sum(left[r] for r in state[1])


def mutants(rng: random.Random, data: bytes, noise_bytes: bytes = b'()[]{}"\\:,- abc019\n\xe3') -> list[bytes]:
    """Six near-misses of `data`: a byte of `noise_bytes` put in, or a byte taken out, at random places."""
    cuts = [rng.randrange(len(data) + 1) for _ in range(3)]
    noise = [bytes([rng.choice(noise_bytes)]) for _ in range(3)]
    return [data[:c] + n + data[c:] for c, n in zip(cuts, noise)] + [data[:c] + data[c + 1 :] for c in cuts]


def sampled_answers(text: str, vocab: list[bytes], trials: int, steps: int = 40) -> list[bytes]:
    """Answers held to guided_grammar `text` through the real sampler, with random logits over `vocab`
    (id 0 the EOS, often the likeliest), one a trial: those the EOS ended (none may fail a step)."""
    from spmd_serve.engine.json_masks import JsonVocab
    from spmd_serve.engine.sampler import Sampler
    from spmd_serve.sampling_params import SamplingParams
    from spmd_serve.scheduler.request import Request
    from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput

    sampler, rng, ended = Sampler(), np.random.default_rng(0), []
    sampler.json_vocab = JsonVocab(vocab)
    for trial in range(trials):
        out: list[int] = []
        r = Request("g", [1], SamplingParams(max_tokens=64, temperature=1.0, seed=trial, gbnf=text), frozenset({0}))
        r.output_token_ids = out
        for _ in range(steps):
            x = rng.normal(0, 2.0, len(vocab)).astype(np.float32)
            x[0] += 1.5
            step = sampler.sample(SchedulerOutput([ScheduledSeq(r, 0, 1, True)]), x[None, :])
            assert not step.failed, step.failed
            if step.tokens[0][0] == 0:
                ended.append(b"".join(vocab[t] for t in out))
                break
            out.append(step.tokens[0][0])
    return ended
