"""DeepSeek's MTP layer exported as a draft model of its own (`<export>/mtp/`, a `Companion`).

The MTP layer (`model.layers.<L>.*`, L = num_hidden_layers) drafts the token after next from the
target's hidden row at position i and the embedding of token i + 1.  It is exported as a one-layer
DeepSeek whose layer 0 is layer L, so every stage but one is the family's own:

    embed(t_{i+1}) ─ enorm ─┐
                            ├ concat ─ eh_proj ─ MLA + MoE (layer L, its own KV pool) ─ norm ─ head
    prev_hidden h_i ─ hnorm ┘                                                         └ hidden_rows

The draft is the family's own model with `DeepseekConfig.mtp_draft` set: the family then adds
`MtpInputStage` (export/deepseek/mtp_stage.py) and its weights (`input_weights`).  It reads the new
graph input `prev_hidden` [T, H] and does the norms and eh_proj, row-parallel over the
concatenation (each rank its 2H / tp inputs, a partial sum like every stage's).  The head also
outputs the MTP's own rows before the norm (`hidden_rows`): further drafts chain on them, as vLLM
does with one MTP layer.

Whose conventions (weights.mtp_convention): a PaddleNLP checkpoint follows `DeepseekV2MTPLayer`
(the target's rows before its final norm, concat(hnorm(h), enorm(e)), an eh_proj bias, the
model's embedding, norm and head); an HF checkpoint (the published V3 weights) follows vLLM /
SGLang (rows after the final norm, concat(enorm(e), hnorm(h)), the layer's own `embed_tokens` and
`shared_head`).  eh_proj's input rows are stored embedding first for both (PaddleNLP's halves
swapped), so the graph is the same; the choice is recorded in mtp/config.json's `mtp_draft`.
Only the first MTP layer is exported (DeepSeek-V3 has one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from spmd_serve.export.deepseek import weights
from spmd_serve.export.deepseek.config import DeepseekConfig, MtpDraft
from spmd_serve.export.errors import ShardingError
from spmd_serve.export.family import Companion, ModelFamily
from spmd_serve.export.lazy import LazyMap, constant
from spmd_serve.manifest import PREV_HIDDEN, ShardDims

_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "eh_proj.bias", "embed_tokens.weight")
_SHARED_HEAD = {"shared_head.norm.weight": "model.norm.weight", "shared_head.head.weight": "lm_head.weight"}


def draft_checkpoint(mc: DeepseekConfig, hf: Mapping[str, np.ndarray]) -> tuple[DeepseekConfig, LazyMap]:
    """(the one-layer config, HF-named weights) of the MTP draft: layer L's tensors as layer 0's, its
    own embedding / shared_head where the checkpoint has them (else the target's), eh_proj's input
    rows embedding first, and `mtp.*` for the input stage."""
    layer = mc.num_layers
    src, dst = f"model.layers.{layer}.", "model.layers.0."
    convention = weights.mtp_convention(mc, hf)
    assert convention is not None, "a checkpoint without MTP layers has no MTP draft"
    draft_mc = replace(
        mc,
        num_layers=1,
        first_k_dense_replace=0 if mc.is_moe(layer) else 1,
        moe_layer_freq=1,
        num_nextn_predict_layers=0,
        hidden_out="pre_norm",  # chained drafts read the MTP's own rows before its norm
        mtp_draft=MtpDraft(layer, convention),
    )
    out = LazyMap()
    for k in hf:
        if k.startswith(src) and not k.endswith(_OWN) and not k.startswith(src + "shared_head."):
            out.take(dst + k[len(src) :], hf, k)
    out.take("model.embed_tokens.weight", hf, _own_or(hf, src + "embed_tokens.weight", "model.embed_tokens.weight"))
    for own, target in _SHARED_HEAD.items():
        out.take(target, hf, _own_or(hf, src + own, target))
    out.put("mtp.eh_proj", _eh_proj, hf, src + "eh_proj.weight", mc.hidden, convention == weights.PADDLENLP)
    if src + "eh_proj.bias" in hf:
        out.take("mtp.eh_bias", hf, src + "eh_proj.bias")
    else:
        out.put("mtp.eh_bias", constant, np.zeros(mc.hidden, np.float32))
    out.take("mtp.enorm", hf, src + "enorm.weight")
    out.take("mtp.hnorm", hf, src + "hnorm.weight")
    return draft_mc, out


def _own_or(hf: Mapping[str, np.ndarray], own: str, target: str) -> str:
    """The MTP layer's own tensor where the checkpoint has it, else the target's."""
    return own if own in hf else target


def _eh_proj(hf: Mapping[str, np.ndarray], name: str, h: int, paddlenlp: bool) -> np.ndarray:
    """eh_proj [H, 2H] (HF layout), its input columns embedding first."""
    w = hf[name]
    return np.concatenate([w[:, h:], w[:, :h]], axis=1) if paddlenlp else w  # PaddleNLP's concat(h, e) → (e, h)


def check_split(mc: DeepseekConfig, tp: int) -> None:
    """eh_proj is row-parallel over its 2H inputs: ShardingError unless tp divides them."""
    if 2 * mc.hidden % tp:
        raise ShardingError(f"MTP eh_proj input 2 * hidden_size={2 * mc.hidden} is not divisible by --tp {tp}")


def input_weights(
    hf: Mapping[str, np.ndarray], mc: DeepseekConfig, dims: ShardDims, rank: int
) -> dict[str, np.ndarray]:
    """`MtpInputStage`'s weights on `rank`: `mtp.{enorm,hnorm}`, its rows of eh_proj (Paddle layout
    [2H / tp, H]) and the bias (rank 0's only: the ranks' partials are summed)."""
    per = 2 * mc.hidden // dims.tp
    rows = slice(rank * per, (rank + 1) * per)
    bias = hf["mtp.eh_bias"] if rank == 0 else np.zeros_like(hf["mtp.eh_bias"])
    extra = {"mtp.enorm": hf["mtp.enorm"], "mtp.hnorm": hf["mtp.hnorm"], "mtp.eh_proj": hf["mtp.eh_proj"].T[rows]}
    return {k: np.ascontiguousarray(v, np.float32) for k, v in (extra | {"mtp.eh_bias": bias}).items()}


def draft_record(draft: MtpDraft) -> dict[str, Any]:
    """mtp/config.json's `mtp_draft`: what the draft reads and whose conventions it follows."""
    order = "concat(hnorm(h), enorm(e))" if draft.convention == weights.PADDLENLP else "concat(enorm(e), hnorm(h))"
    return {
        "of": "..",  # the target: the directory above
        "layer": draft.layer,
        "convention": draft.convention,
        "input": PREV_HIDDEN,
        "target_hidden": weights.TARGET_HIDDEN[draft.convention],  # the target's hidden_rows the first draft reads
        "chained_hidden": "pre_norm",  # further drafts read this graph's own hidden_rows
        "eh_proj": f"{order} as the checkpoint's code computes it; stored embedding rows first",
    }


def companions(
    family: ModelFamily[DeepseekConfig], mc: DeepseekConfig, hf: Mapping[str, np.ndarray], cfg: dict[str, Any]
) -> list[Companion]:
    """The MTP draft beside the target (none without MTP layers), exported by the same family."""
    if weights.mtp_convention(mc, hf) is None:
        return []
    draft_mc, draft = draft_checkpoint(mc, hf)
    hf_config = dict(
        cfg,
        num_hidden_layers=1,
        num_nextn_predict_layers=0,
        first_k_dense_replace=draft_mc.first_k_dense_replace,
        moe_layer_freq=1,
    )
    return [Companion(weights.MTP_FOLDER, family, draft_mc, draft, hf_config)]
