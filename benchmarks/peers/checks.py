"""What each server makes of the same inputs, compared across servers: prompt token counts of
text prompts and greedy continuations of token-id prompts."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from benchmarks.peers import gguf_convert, servers

# Text prompts for the tokenizer check besides the random ones: spaces, digits, newlines, a chat
# marker, characters that fall back to bytes.
FIXED_TEXTS = (
    "Hello world, this is a test.",
    "  two  spaces and\nnew lines\n\n",
    "The year 2024 had 366 days.",
    "<|user|>\nhi<|end|>",
    "naïve café — 東京 🚀",
)


def _post(url: str, body: dict, timeout: float = 300.0) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def check_inputs(tokenizer_model: Path, n: int, length: int, seed: int) -> tuple[list[str], list[list[int]]]:
    """Text prompts for the tokenizer check (FIXED_TEXTS plus `n` texts decoded from `length`
    random ordinary (NORMAL) pieces) and 4 token-id prompts for the greedy check."""
    import numpy as np
    import sentencepiece as spm

    proto = tokenizer_model.read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    _, _, types = gguf_convert.sentencepiece_vocab(proto)
    normal = np.array([i for i, t in enumerate(types) if t == 1])
    rng = np.random.default_rng(seed)
    texts = [*FIXED_TEXTS, *(sp.decode(rng.choice(normal, length).tolist()) for _ in range(n))]
    return texts, [rng.choice(normal, length).tolist() for _ in range(4)]


def probe(server: servers.Server, texts: list[str], prompt_ids: list[list[int]], n_out: int) -> dict:
    """What this server makes of the same inputs: prompt token counts of text prompts (usage of a
    1-token completion) and greedy continuations of token-id prompts."""
    url = server.base_url + "/v1/completions"
    common = {"model": "default", "temperature": 0.0, "ignore_eos": True}
    counts = [_post(url, {**common, "prompt": t, "max_tokens": 1})["usage"]["prompt_tokens"] for t in texts]
    greedy = [
        _post(url, {**common, "prompt": ids, "max_tokens": n_out, "min_tokens": n_out})["choices"][0]["text"]
        for ids in prompt_ids
    ]
    return {"prompt_tokens": counts, "greedy_text": greedy}


def summarize_checks(names: list[str], probes: dict[str, dict]) -> dict:
    """Per row against the first: how the prompt token counts of the same texts differ
    ({ours - theirs: how many texts}; {0: all} is a match) and how many greedy continuations of
    the same token ids are identical."""
    if not probes:
        return {}
    ref = probes[names[0]]
    out: dict = {"reference": names[0]}
    for name in names[1:]:
        p = probes[name]
        deltas: dict[int, int] = {}
        for a, b in zip(ref["prompt_tokens"], p["prompt_tokens"]):
            deltas[a - b] = deltas.get(a - b, 0) + 1
        same = sum(a == b for a, b in zip(ref["greedy_text"], p["greedy_text"]))
        out[name] = {"prompt_tokens_ref_minus_this": deltas, "greedy_identical": f"{same}/{len(ref['greedy_text'])}"}
    return out
