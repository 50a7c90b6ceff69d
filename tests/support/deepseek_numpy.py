"""An independent float64 numpy DeepSeek-V2/V3 forward pass, written from DeepSeek's published
modeling code (`modeling_deepseek.py` of the V2 / V3 HF repositories), for tests (helper module).

It cross-checks PaddleNLP's reference (tests/support/deepseek_reference.py) on one config, so that
a shim or a PaddleNLP quirk cannot make both sides agree on the wrong answer.  It follows the
published code's structure, not spmd_serve's: MLA in its expanded form (k_nope and v from
`kv_b_proj` per head), the interleaved RoPE layout undone per call, YaRN's inv_freq and mscale,
the MoE gate (greedy / group_limited_greedy / noaux_tc; softmax / sigmoid; correction bias for
selection only; top-k normalisation and routed scaling) and each expert run over its own tokens.
"""

from __future__ import annotations

import math

import numpy as np

F64 = np.float64


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w.astype(F64) * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _yarn(cfg: dict, dim: int) -> tuple[np.ndarray, float, float]:
    """(inv_freq [dim/2], cos/sin multiplier, softmax scale multiplier) — DeepseekV2YarnRotaryEmbedding."""
    base = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=F64) / dim)
    s = cfg.get("rope_scaling")
    if not s:
        return inv, 1.0, 1.0
    factor, orig = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast", 32), s.get("beta_slow", 1)

    def corr_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=F64) - low) / (high - low), 0, 1)
    extra_mask = 1.0 - ramp
    inv = (inv / factor) * (1 - extra_mask) + inv * extra_mask

    def get_mscale(scale, m):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m_cos = get_mscale(factor, s.get("mscale", 1)) / get_mscale(factor, s.get("mscale_all_dim", 0))
    all_dim = s.get("mscale_all_dim", 0)
    m_attn = get_mscale(factor, all_dim) ** 2 if all_dim else 1.0
    return inv, m_cos, m_attn


def _rope(x: np.ndarray, pos: np.ndarray, inv: np.ndarray, mult: float) -> np.ndarray:
    """apply_rotary_pos_emb of the published code on x [S, heads, d]: de-interleave, rotate_half."""
    s, h, d = x.shape
    x = x.reshape(s, h, d // 2, 2).transpose(0, 1, 3, 2).reshape(s, h, d)
    freqs = pos[:, None].astype(F64) * inv[None, :]
    emb = np.concatenate([freqs, freqs], -1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * (np.cos(emb) * mult) + rot * (np.sin(emb) * mult)


def _attention(cfg: dict, w: dict, p: str, x: np.ndarray) -> np.ndarray:
    """DeepseekV2Attention.forward (no cache) on x [S, H]."""
    nh, dn, dr, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr, eps, s = cfg["kv_lora_rank"], cfg["rms_norm_eps"], x.shape[0]
    a = p + "self_attn."
    if cfg.get("q_lora_rank") is None:
        q = x @ w[a + "q_proj.weight"].T
    else:
        q = _rms(x @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], eps) @ w[a + "q_b_proj.weight"].T
    q = q.reshape(s, nh, dn + dr)
    ckv = x @ w[a + "kv_a_proj_with_mqa.weight"].T
    c, k_pe = ckv[:, :kvr], ckv[:, kvr:].reshape(s, 1, dr)
    kv = (_rms(c, w[a + "kv_a_layernorm.weight"], eps) @ w[a + "kv_b_proj.weight"].T).reshape(s, nh, dn + dv)
    inv, m_cos, m_attn = _yarn(cfg, dr)
    pos = np.arange(s)
    q_pe, k_pe = _rope(q[..., dn:], pos, inv, m_cos), _rope(k_pe, pos, inv, m_cos)
    qs = np.concatenate([q[..., :dn], q_pe], -1)  # [S, nh, dn+dr]
    ks = np.concatenate([kv[..., :dn], np.broadcast_to(k_pe, (s, nh, dr))], -1)
    scores = np.einsum("qhd,khd->hqk", qs, ks) * ((dn + dr) ** -0.5 * m_attn)
    scores = np.where(np.tril(np.ones((s, s), bool))[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", probs, kv[..., dn:]).reshape(s, nh * dv)
    return out @ w[a + "o_proj.weight"].T


def _mlp(w: dict, p: str, x: np.ndarray) -> np.ndarray:
    return (_silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def _top(v: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-v, axis=-1, kind="stable")[..., :k]


def route(cfg: dict, w: dict, p: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MoEGate.forward of the published code: (topk_idx [S, k], topk_weight [S, k])."""
    logits = x @ w[p + "mlp.gate.weight"].T
    if cfg["scoring_func"] == "softmax":
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
    else:
        scores = 1.0 / (1.0 + np.exp(-logits))
    k, method = cfg["num_experts_per_tok"], cfg["topk_method"]
    s, e = scores.shape
    if method == "greedy":
        idx = _top(scores, k)
    else:
        g = cfg["n_group"]
        choice = scores + w[p + "mlp.gate.e_score_correction_bias"][None] if method == "noaux_tc" else scores
        grouped = choice.reshape(s, g, e // g)
        group_scores = np.sort(grouped, -1)[..., -2:].sum(-1) if method == "noaux_tc" else grouped.max(-1)
        group_mask = np.zeros((s, g))
        np.put_along_axis(group_mask, _top(group_scores, cfg["topk_group"]), 1.0, axis=1)
        idx = _top(np.where(np.repeat(group_mask, e // g, 1) > 0, choice, 0.0), k)  # masked_fill(~mask, 0)
    weight = np.take_along_axis(scores, idx, 1)  # noaux_tc: the bias chose, the scores weigh
    if k > 1 and cfg["norm_topk_prob"]:
        weight = weight / (weight.sum(-1, keepdims=True) + 1e-20)
    return idx, weight * cfg["routed_scaling_factor"]


def _moe(cfg: dict, w: dict, p: str, x: np.ndarray) -> np.ndarray:
    """DeepseekV2MoE.moe_infer: each expert over the tokens routed to it, plus the shared experts."""
    idx, weight = route(cfg, w, p, x)
    out = np.zeros_like(x)
    for e in range(cfg["n_routed_experts"]):
        tok, slot = np.nonzero(idx == e)
        if tok.size:
            out[tok] += _mlp(w, f"{p}mlp.experts.{e}.", x[tok]) * weight[tok, slot][:, None]
    if cfg.get("n_shared_experts"):
        out += _mlp(w, p + "mlp.shared_experts.", x)
    return out


def forward_logits(cfg: dict, weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Logits [S, V] (float64) of a cache-free pass over `ids`."""
    w = {k: v.astype(F64) for k, v in weights.items()}
    eps = cfg["rms_norm_eps"]
    h = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = h + _attention(cfg, w, p, _rms(h, w[p + "input_layernorm.weight"], eps))
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        moe = cfg.get("n_routed_experts") and i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0
        h = h + (_moe(cfg, w, p, x) if moe else _mlp(w, p + "mlp.", x))
    return _rms(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
