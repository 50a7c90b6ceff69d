"""How close a quantised run's greedy decoding stays to the fp32 run's (test helper for the
quantisation tests): per-row logits cosine while the contexts are still identical, the share of
prompts with identical tokens, and how close fp32's own choice was where they diverged."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Agreement:
    min_cosine: float  # of the full-vocab logits rows, over every row whose context is still identical
    mean_cosine: float
    agreement: float  # share of prompts whose tokens equal the reference's
    widest_gap: float  # widest fp32 top-2 logit gap at a divergence (0 without one)

    def __str__(self) -> str:
        return (
            f"min cosine {self.min_cosine:.5f}, mean {self.mean_cosine:.5f}, agreement {self.agreement:.3f}, "
            f"widest fp32 top-2 gap at a divergence {self.widest_gap:.3f}"
        )


def agreement(
    ref: tuple[list[list[int]], list[np.ndarray]], run: tuple[list[list[int]], list[np.ndarray]], new_tokens: int
) -> Agreement:
    """`ref`, `run`: (tokens per prompt, logits [n, V] per prompt) of the fp32 and the compared run;
    rows are compared up to and including the first differing token."""
    ref_toks, ref_logits = ref
    toks, logits = run
    cos, agree, gaps = [], 0, [0.0]
    for rt, rl, t, lg in zip(ref_toks, ref_logits, toks, logits):
        agree += rt[:new_tokens] == t[:new_tokens]
        same = next((i for i, (a, b) in enumerate(zip(rt, t)) if a != b), len(rt) - 1)
        for a, b in zip(rl[: same + 1], lg[: same + 1]):
            cos.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
        if rt[same] != t[same]:  # how close fp32's own choice was where the two diverged
            gaps.append(float(rl[same][rt[same]] - rl[same][t[same]]))
    return Agreement(min(cos), float(np.mean(cos)), agree / len(ref_toks), max(gaps))
