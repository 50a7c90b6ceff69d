"""DeepSeek's MTP layer exported as a draft model of its own (`<export>/mtp/`, a `Companion`).

The MTP layer (`model.layers.<L>.*`, L = num_hidden_layers) drafts the token after next from the
target's hidden row at position i and the embedding of token i + 1.  It is exported as a one-layer
DeepSeek whose layer 0 is layer L, so every stage but one is the family's own:

    embed(t_{i+1}) ─ enorm ─┐
                            ├ concat ─ eh_proj ─ MLA + MoE (layer L, its own KV pool) ─ norm ─ head
    prev_hidden h_i ─ hnorm ┘                                                         └ hidden_rows

`prev_hidden` [T, H] is a new graph input; `MtpInputStage` (export/deepseek/mtp_stage.py) does
the norms and eh_proj, row-parallel over the concatenation (each rank its 2H / tp inputs, a partial
sum like every stage's).  The head also outputs the MTP's own rows before the norm
(`hidden_rows`): further drafts chain on them, as vLLM does with one MTP layer.

Whose conventions (weights.mtp_convention): a PaddleNLP checkpoint follows `DeepseekV2MTPLayer`
(the target's rows before its final norm, concat(hnorm(h), enorm(e)), an eh_proj bias, the
model's embedding, norm and head); an HF checkpoint (the published V3 weights) follows vLLM /
SGLang (rows after the final norm, concat(enorm(e), hnorm(h)), the layer's own `embed_tokens` and
`shared_head`).  eh_proj's input rows are stored embedding first for both (PaddleNLP's halves
swapped), so the graph is the same; the choice is recorded in mtp/config.json's `mtp_draft`.
Only the first MTP layer is exported (DeepSeek-V3 has one).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from spmd_serve.export.deepseek import DeepseekFamily, weights
from spmd_serve.export.deepseek.config import DeepseekConfig
from spmd_serve.export.errors import ShardingError
from spmd_serve.export.family import Companion
from spmd_serve.manifest import PREV_HIDDEN, ShardDims

_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "eh_proj.bias", "embed_tokens.weight")
_SHARED_HEAD = {"shared_head.norm.weight": "model.norm.weight", "shared_head.head.weight": "lm_head.weight"}


def draft_checkpoint(mc: DeepseekConfig, hf: dict[str, np.ndarray]) -> tuple[DeepseekConfig, dict[str, np.ndarray]]:
    """(the one-layer config, HF-named weights) of the MTP draft: layer L's tensors as layer 0's, its
    own embedding / shared_head where the checkpoint has them (else the target's), eh_proj's input
    rows embedding first, and `mtp.*` for the input stage."""
    layer = mc.num_layers
    src, dst = f"model.layers.{layer}.", "model.layers.0."
    draft_mc = replace(
        mc,
        num_layers=1,
        first_k_dense_replace=0 if mc.is_moe(layer) else 1,
        moe_layer_freq=1,
        num_nextn_predict_layers=0,
        hidden_out="pre_norm",  # chained drafts read the MTP's own rows before its norm
    )
    out = {dst + k[len(src) :]: v for k, v in hf.items() if k.startswith(src) and not k.endswith(_OWN)}
    out = {k: v for k, v in out.items() if not k.startswith(dst + "shared_head.")}
    out["model.embed_tokens.weight"] = hf.get(src + "embed_tokens.weight", hf["model.embed_tokens.weight"])
    for own, target in _SHARED_HEAD.items():
        out[target] = hf.get(src + own, hf[target])
    h = mc.hidden
    w = hf[src + "eh_proj.weight"]  # [H, 2H] HF layout
    if weights.mtp_convention(mc, hf) == weights.PADDLENLP:
        w = np.concatenate([w[:, h:], w[:, :h]], axis=1)  # PaddleNLP's concat(h, e) → (e, h)
    out["mtp.eh_proj"] = w
    out["mtp.eh_bias"] = hf.get(src + "eh_proj.bias", np.zeros(h, np.float32))
    out["mtp.enorm"], out["mtp.hnorm"] = hf[src + "enorm.weight"], hf[src + "hnorm.weight"]
    return draft_mc, out


class DeepseekMtpFamily(DeepseekFamily):
    """The MTP draft's export: the family's stages with `MtpInputStage` after the embedding."""

    def __init__(self, convention: str, layer: int) -> None:
        self.convention, self.layer = convention, layer

    def shard_dims(self, mc: DeepseekConfig, tp: int) -> ShardDims:
        if 2 * mc.hidden % tp:
            raise ShardingError(f"MTP eh_proj input 2 * hidden_size={2 * mc.hidden} is not divisible by --tp {tp}")
        return super().shard_dims(mc, tp)

    def rank_weights(self, mc: DeepseekConfig, hf: dict[str, np.ndarray], dims: ShardDims, rank: int, *quant: Any):
        """The family's shard of layer 0, plus `mtp.{enorm,hnorm}`, this rank's rows of eh_proj
        (Paddle layout [2H / tp, H]) and its bias (on rank 0 only: the ranks' partials are summed)."""
        out = super().rank_weights(mc, hf, dims, rank, *quant)
        per = 2 * mc.hidden // dims.tp
        rows = slice(rank * per, (rank + 1) * per)
        bias = hf["mtp.eh_bias"] if rank == 0 else np.zeros_like(hf["mtp.eh_bias"])
        extra = {
            "mtp.enorm": hf["mtp.enorm"],
            "mtp.hnorm": hf["mtp.hnorm"],
            "mtp.eh_proj": hf["mtp.eh_proj"].T[rows],
            "mtp.eh_bias": bias,
        }
        return out | {k: np.ascontiguousarray(v, np.float32) for k, v in extra.items()}

    def build_stages(self, w: dict[str, Any], dims: ShardDims, rank: int) -> list:
        from spmd_serve.export.deepseek.mtp_stage import MtpInputStage

        stages = super().build_stages(w, dims, rank)
        return [stages[0], MtpInputStage(w, dims, rank), *stages[1:]]

    def served_options(self, mc: DeepseekConfig) -> dict[str, Any]:
        hidden = weights.TARGET_HIDDEN[self.convention]
        order = "concat(hnorm(h), enorm(e))" if self.convention == weights.PADDLENLP else "concat(enorm(e), hnorm(h))"
        draft = {
            "of": "..",  # the target: the directory above
            "layer": self.layer,
            "convention": self.convention,
            "input": PREV_HIDDEN,
            "target_hidden": hidden,  # which rows of the target the first draft reads (hidden_rows)
            "chained_hidden": "pre_norm",  # further drafts read this graph's own hidden_rows
            "eh_proj": f"{order} as the checkpoint's code computes it; stored embedding rows first",
        }
        return dict(super().served_options(mc), mtp=None, mtp_draft=draft)


def companions(mc: DeepseekConfig, hf: dict[str, np.ndarray], cfg: dict[str, Any]) -> list[Companion]:
    """The MTP draft beside the target (none without MTP layers)."""
    convention = weights.mtp_convention(mc, hf)
    if convention is None:
        return []
    draft_mc, draft = draft_checkpoint(mc, hf)
    hf_config = dict(
        cfg,
        num_hidden_layers=1,
        num_nextn_predict_layers=0,
        first_k_dense_replace=draft_mc.first_k_dense_replace,
        moe_layer_freq=1,
    )
    return [Companion(weights.MTP_FOLDER, DeepseekMtpFamily(convention, mc.num_layers), draft_mc, draft, hf_config)]
