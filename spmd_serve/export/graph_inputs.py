"""The per-step inputs every graph may take, and the graph-side helpers that read the host tables.

Graphs with the C++ paged attention take the plan's own arrays only.  Paddle's attention (the
`--graph-ops paddle` export, an int8 pool) also takes tables (RoPE cos/sin, grid and past indices,
mask) built once per step on the host by worker/step_tables.py, which documents their layout.
"""

from __future__ import annotations

import paddle

# Per-step graph inputs (name → dtype, shape); every rank derives them from the StepPlan.
STEP_INPUTS: dict[str, tuple[str, list[int]]] = {
    "input_ids": ("int64", [-1]),  # [T] token ids of this step
    "unpad_index": ("int64", [-1]),  # [T] index into the flattened [B*S] grid
    "logits_index": ("int64", [-1]),  # [B] index into T of each sequence's last token
    "block_tables": ("int64", [-1, -1]),  # [B, MB] the plan's (paged attention)
    "ctx_lens": ("int64", [-1]),  # [B] past tokens of each sequence (idem)
    "query_lens": ("int64", [-1]),  # [B] new tokens of each sequence (idem)
    "slot_mapping": ("int64", [-1]),  # [T] pool slot of each new token (idem)
    # per-step tables, built on the host once per step (worker/step_tables.py has their layout)
    "rope_cos": ("float32", [-1, -1, -1]),  # [T, nh + 2 kvh, d]
    "rope_sin": ("float32", [-1, -1, -1]),  # [T, nh + 2 kvh, d]
    "grid_index": ("int64", [-1, -1]),  # [B, S] index into T
    "past_index": ("int64", [-1, -1, -1, 3]),  # [B, kvh, P, 3]
    "attn_mask": ("float32", [-1, 1, -1, -1]),  # [B, 1, S, P+S]
    "pe_cos": ("float32", [-1, -1]),  # [T, dr] MLA's shared rope key rotation
    "pe_sin": ("float32", [-1, -1]),  # [T, dr]
    "latent_index": ("int64", [-1, -1, 2]),  # [B, P, 2] MLA's past latent slots
}


def grid_dims(env: dict):
    """(P, S) of this step as graph scalars, read once per graph from the tables' shapes."""
    if "_dims" not in env:
        env["_dims"] = (paddle.shape(env["past_index"])[2], paddle.shape(env["grid_index"])[1])
    return env["_dims"]


def grouped_mask(env: dict, group: int):
    """attn_mask for scores laid out [B, kvh, g*S, P+S] (row = g_i * S + s): [B, 1, g*S, P+S],
    tiled once per graph."""
    if "_mask" not in env:
        mask = env["attn_mask"]
        env["_mask"] = mask.tile([1, group, 1, 1]).reshape([0, 1, -1, 0]) if group > 1 else mask
    return env["_mask"]
