"""Per-step tables of the attention graphs: built once per step on the host (numpy) and fed to every
attention segment as graph inputs (the graph side that reads them: export/graph_inputs.py).

Every attention layer of a step needs the same RoPE cos/sin, grid index, past gather index and
mask.  Built inside the graph they cost ~60 small ops per graph, i.e. per attention *segment* at
TP > 1 (8 times per step for --demo small at TP=2); in numpy they cost tens of microseconds once.
Shapes: T tokens this step, B sequences, S = longest query of the pass, P = past slots gathered
(MB * block size), heads = nh + 2 kvh (the q, k and v heads of this rank), d = head_dim.

    rope_cos, rope_sin [T, heads, d] f32   x * cos + roll(x, d/2) * sin on the fused q|k|v heads
    grid_index   [B, S] int64              token of each grid slot (padding clamped to T - 1)
    past_index   [B, kvh, P, 3] int64      (block, kv head, offset) of each past slot, head-major
    attn_mask    [B, 1, S, P + S] f32      additive: past below ctx_len; new tokens causal and real

MLA (DeepSeek) attends over one latent vector per past slot and rotates one rope key shared by
every head (dr = its rope dim), so it takes its own two tables next to grid_index and attn_mask:

    pe_cos, pe_sin [T, dr] f32             x * cos + roll(x, dr/2) * sin, the same for every head
    latent_index [B, P, 2] int64           (block, offset) of each past slot for `gather_nd`
"""

from __future__ import annotations

import math

import numpy as np

from spmd_serve.manifest import PREV_HIDDEN, ShardDims
from spmd_serve.protocol import grid_indices, logits_index

NEG_INF = -1e30  # additive mask; no row is fully masked (every query sees itself)
GRID_INPUTS = frozenset({"pad_index", "unpad_index", "grid_index", "attn_mask"})  # read the padded grid
TABLES = ("rope_cos", "rope_sin", "grid_index", "past_index", "attn_mask", "pe_cos", "pe_sin", "latent_index")


def rope_tables(positions: np.ndarray, inv_freq: np.ndarray, dims: ShardDims) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, heads, d] for `x * cos + roll(x, d/2) * sin` on the fused q|k|v heads:
    * rotate_half(x) = roll(x, d/2) with its first half negated — the sign is folded into sin;
    * q heads carry the attention scale 1/sqrt(d) (exact for d a power of 4, e.g. 64);
    * v heads get cos = 1, sin = 0: passed through unchanged (x * 1 + y * 0 = x exactly)."""
    nh, kvh, d = dims.heads, dims.kv_heads, dims.head_dim
    kind = np.repeat([0, 1, 2], [nh, kvh, kvh])  # q, k, v per head
    mult = np.where(kind == 0, 1.0 / math.sqrt(d), np.where(kind == 1, 1.0, 0.0)).astype(np.float32)[:, None]
    sign = np.where(np.arange(d) < d // 2, -1.0, 1.0).astype(np.float32)  # [d]
    freqs = positions.astype(np.float32)[:, None] * np.asarray(inv_freq, np.float32)[None, :]  # [T, d/2]
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]  # [T, 1, d]
    cos = np.cos(emb) * mult + (kind == 2).astype(np.float32)[:, None]  # [T, heads, d]
    sin = np.sin(emb) * (mult * sign)
    return cos, sin


def shared_rope_tables(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, d] (d = 2 len(inv_freq)) of one rotation for all heads; rotate_half's sign in sin."""
    freqs = positions.astype(np.float32)[:, None] * np.asarray(inv_freq, np.float32)[None, :]  # [T, d/2]
    emb = np.concatenate([freqs, freqs], axis=-1)
    sign = np.where(np.arange(emb.shape[1]) < emb.shape[1] // 2, -1.0, 1.0).astype(np.float32)
    return np.cos(emb), np.sin(emb) * sign


def latent_index(block_tables: np.ndarray, block_size: int) -> np.ndarray:
    """[B, P, 2]: (block, offset) of each past slot for `gather_nd` on a [NB, bs, K] pool."""
    b, mb = block_tables.shape
    pos = np.arange(mb * block_size)
    idx = np.empty((b, pos.size, 2), np.int64)
    idx[..., 0] = block_tables[:, pos // block_size]
    idx[..., 1] = (pos % block_size)[None, :]
    return idx


def past_index(block_tables: np.ndarray, block_size: int, kvh: int) -> np.ndarray:
    """[B, kvh, P, 3]: (block, kv head, offset) of each past slot for `gather_nd` on a
    [NB, kvh, bs, d] pool, so the gather yields [B, kvh, P, d] head-major in token order."""
    b, mb = block_tables.shape
    pos = np.arange(mb * block_size)
    idx = np.empty((b, kvh, pos.size, 3), np.int64)
    idx[..., 0] = block_tables[:, pos // block_size][:, None, :]
    idx[..., 1] = np.arange(kvh)[None, :, None]
    idx[..., 2] = (pos % block_size)[None, None, :]
    return idx


def attn_mask(ctx_lens: np.ndarray, query_lens: np.ndarray, p: int, s: int) -> np.ndarray:
    """[B, 1, S, P + S] additive mask: 0 where a query row may attend, NEG_INF elsewhere."""
    past_ok = np.arange(p)[None, :] < ctx_lens[:, None]  # [B, P]
    ar = np.arange(s)
    cur_ok = (ar[None, :] <= ar[:, None])[None] & (ar[None, :] < query_lens[:, None])[:, None]  # [B, S, S]
    ok = np.concatenate([np.broadcast_to(past_ok[:, None, :], (len(ctx_lens), s, p)), cur_ok], axis=2)
    return np.where(ok, np.float32(0), np.float32(NEG_INF))[:, None]


def _grid_feeds(feeds: dict[str, np.ndarray], plan, block_size: int, names: set[str]) -> None:
    """The padded grid's inputs (GRID_INPUTS) into `feeds`.  Built only for graphs that read them:
    the C++ paged attention's do not, and these numpy calls cost ~44 us a step on the caches a
    graph step has just left cold (measured)."""
    pad_index, feeds["unpad_index"] = grid_indices(plan.query_lens)[:2]
    feeds["pad_index"] = pad_index
    if "grid_index" in names:
        feeds["grid_index"] = np.minimum(pad_index, max(len(plan.input_ids) - 1, 0))
    if "attn_mask" in names:
        feeds["attn_mask"] = attn_mask(
            plan.ctx_lens, plan.query_lens, plan.block_tables.shape[1] * block_size, pad_index.shape[1]
        )


def step_feeds(plan, dims: ShardDims, inv_freq: np.ndarray, block_size: int, names) -> dict[str, np.ndarray]:
    """The graph inputs in `names` for a plan (anything with StepPlan's arrays): the plan's own
    arrays, the grid indices (protocol.grid_indices) and the tables above, each computed once."""
    names = set(names)
    rows = getattr(plan, "logits_lens", None)  # a speculative step scores every draft position
    feeds = {
        "input_ids": plan.input_ids,
        "positions": plan.positions,
        "block_tables": plan.block_tables,
        "ctx_lens": plan.ctx_lens,
        "query_lens": plan.query_lens,
        "logits_index": logits_index(plan.query_lens, rows),
    }
    if names & GRID_INPUTS:  # only the graphs with Paddle's attention read the padded grid
        _grid_feeds(feeds, plan, block_size, names)
    hidden = getattr(plan, "hidden", None)  # an MTP draft plan's rows (protocol.StepPlan.hidden)
    if hidden is not None and PREV_HIDDEN in names:
        feeds[PREV_HIDDEN] = hidden
    if "slot_mapping" in names:
        feeds["slot_mapping"] = plan.slot_mapping
    if names & {"rope_cos", "rope_sin"}:
        feeds["rope_cos"], feeds["rope_sin"] = rope_tables(plan.positions, inv_freq, dims)
    if "past_index" in names:
        feeds["past_index"] = past_index(plan.block_tables, block_size, dims.kv_heads)
    if names & {"pe_cos", "pe_sin"}:
        feeds["pe_cos"], feeds["pe_sin"] = shared_rope_tables(plan.positions, inv_freq)
    if "latent_index" in names:
        feeds["latent_index"] = latent_index(plan.block_tables, block_size)
    return feeds
