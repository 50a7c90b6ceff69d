"""The token windows the int8-KV scales are calibrated on (export/calibrate.py): the demo corpus
(export/demo/corpus.txt and chats.txt, plain English prose and chats) through the checkpoint's own
tokenizer, laid out over the model's whole context.

Why text and the whole context: K and V of real text are not those of random tokens (a trained
model's activations on text it knows are larger and differently spread), and K after RoPE and the
hidden states that attention mixes change with the position, so scales from a few short random
sequences clip at long positions.  A window of `CALIBRATION_WINDOW` tokens is one eager pass
(its attention holds window² scores per head); a longer context is covered by up to
`MAX_WINDOWS` windows spread evenly over it, each at its own positions (RoPE's angles are the
positions'; the window's tokens see only each other).  A checkpoint without a tokenizer is
calibrated on random token ids (and the export's record says so).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CALIBRATION_WINDOW = 2048  # tokens per calibration pass
MAX_WINDOWS = 4  # passes at most: a 128k context is sampled by 4 windows, not computed whole
RANDOM_TOKENS = "random token ids (no tokenizer in the checkpoint)"


@dataclass(frozen=True)
class CalibrationWindow:
    """`ids` [n] at positions `start .. start + n - 1` (one causal sequence)."""

    start: int
    ids: np.ndarray


def corpus_text() -> str:
    """The demo corpus and chats, as one text (~25 KB)."""
    from spmd_serve.export.demo.corpus import CORPUS_PATH

    return "\n\n".join(p.read_text(encoding="utf-8") for p in (CORPUS_PATH, CORPUS_PATH.with_name("chats.txt")))


def _encoder(ckpt: Path):
    """The checkpoint's tokenizer as text → ids: PaddleNLP's (what the server uses by default), else
    its tokenizer.json; None when it has neither."""
    if (ckpt / "tokenizer_config.json").is_file():
        try:
            from paddlenlp.transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(ckpt))
            return lambda text: tok.convert_tokens_to_ids(tok.tokenize(text))
        except Exception:  # noqa: BLE001 — PaddleNLP cannot read it: try tokenizer.json
            pass
    if (ckpt / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        hf = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
        return lambda text: hf.encode(text, add_special_tokens=False).ids
    return None


def _bos_id(ckpt: Path) -> int | None:
    try:
        bos = json.loads((ckpt / "config.json").read_text()).get("bos_token_id")
    except (OSError, ValueError):
        return None
    return bos if isinstance(bos, int) else None


def window_starts(context: int, window: int = CALIBRATION_WINDOW, max_windows: int = MAX_WINDOWS) -> list[int]:
    """First positions of the windows that cover [0, context): back to back when that takes at most
    `max_windows`, else `max_windows` spread evenly from 0 to context - window."""
    window = min(window, context)
    n = -(-context // window)
    if n <= max_windows:
        return [min(i * window, context - window) for i in range(n)]
    return [int(s) for s in np.linspace(0, context - window, max_windows).round()]


def calibration_windows(
    ckpt: Path, vocab: int, context: int, window: int = CALIBRATION_WINDOW, seed: int = 0
) -> tuple[list[CalibrationWindow], str]:
    """The windows covering the model's `context` (max_position_embeddings), and what they hold
    (for the export's record).  Each window is the corpus's tokens from a different offset
    (repeated to fill it), the first one after the checkpoint's BOS like a served prompt."""
    encode = _encoder(Path(ckpt))
    starts = window_starts(context, window)
    n = min(window, context)
    if encode is None:
        warnings.warn(f"{ckpt}: no tokenizer, so the int8-KV scales are calibrated on {RANDOM_TOKENS}", stacklevel=2)
        rng = np.random.default_rng(seed)
        return [CalibrationWindow(s, rng.integers(0, vocab, n)) for s in starts], RANDOM_TOKENS
    text = np.array([i for i in encode(corpus_text()) if 0 <= i < vocab], np.int64)  # [N]
    reps = -(-(n + len(text)) // len(text))
    stream = np.tile(text, reps)  # [reps * N]: every offset has n tokens after it
    bos = _bos_id(Path(ckpt))
    out = []
    for k, s in enumerate(starts):
        off = (k * len(text)) // len(starts)
        ids = stream[off : off + n]
        if s == 0 and bos is not None and 0 <= bos < vocab:
            ids = np.concatenate([[bos], ids[:-1]])
        out.append(CalibrationWindow(s, ids))
    return out, f"demo corpus through the checkpoint's tokenizer ({len(text)} tokens)"
