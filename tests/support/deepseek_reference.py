"""PaddleNLP's own DeepSeek-V2/V3 as the reference for tests (helper module, not a test file).

`reference_from_weights(cfg, weights)`: PaddleNLP 3.0.0b4's `DeepseekV2ForCausalLM` /
`DeepseekV3ForCausalLM`, plain fp32 (no fused RMSNorm / RoPE / flash attention, single card),
holding these HF-named weights.  Greedy tokens and logits come from tests/support/
paddlenlp_reference.py's `reference_greedy` / `reference_logits` (full, cache-free passes).

The shims PaddleNLP needs on this Paddle 3.3.1 CPU build, each with its reason, all here:

* `_priority`: the MoE gate multiplies `paddle.cumsum` of an int32 one-hot (which Paddle returns
  as int64) by that int32 mask, and Paddle 3.3 refuses mixed int32 * int64.  The cumsum is kept
  in int32; the values are the same.
* `num_nextn_predict_layers = 0` in the reference: with MTP layers PaddleNLP's forward drops the
  last input position (its training layout for the MTP loss), so its logits and generate() are
  wrong for serving.  The reference is the same model without its MTP layers, which gives the
  same logits on the positions it does compute (`keep_mtp=True` builds the MTP model, e.g. to
  write a PaddleNLP checkpoint holding the MTP weights).
* `DeepseekV2ForCausalLM.forward` with `return_dict=True` takes `outputs.hidden_states` (every
  layer's states: None unless asked for) where it means `last_hidden_state`, and fails; the shim
  runs it with `return_dict=False` (which takes `outputs[0]`, the last hidden state) and wraps
  the logits in the usual output record.  (DeepseekV3ForCausalLM has its own, correct forward.)
* No token is dropped: DeepseekV2MoE builds its gate with `drop_tokens=False`, so the capacity is
  the largest expert load of the batch (asserted by `assert_drops_nothing`).
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
from paddlenlp.transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM
from paddlenlp.transformers.model_outputs import CausalLMOutputWithPast
from paddlenlp.transformers.moe_gate import PretrainedMoEGate

_NOT_CONFIG = ("architectures", "torch_dtype", "quantization_config", "num_nextn_predict_layers")
ARCHS = {
    "DeepseekV2ForCausalLM": (DeepseekV2Config, DeepseekV2ForCausalLM, "deepseek_v2."),
    "DeepseekV3ForCausalLM": (DeepseekV3Config, DeepseekV3ForCausalLM, "deepseek_v3."),
}


def _priority_int32(self, topk_idx: paddle.Tensor, capacity: int) -> paddle.Tensor:
    """PretrainedMoEGate._priority with its cumsum kept in int32 (see the module docstring); the
    rest is PaddleNLP 3.0.0b4's code unchanged."""
    expert_index = paddle.transpose(topk_idx, [1, 0]).reshape([-1])  # [topk * tokens]
    expert_mask = F.one_hot(expert_index, self.num_experts).cast(paddle.int32)
    token_priority = paddle.cumsum(expert_mask, axis=0).cast(paddle.int32) * expert_mask - 1  # the shim
    token_priority = token_priority.reshape((self.top_k, -1, self.num_experts))
    token_priority = paddle.max(paddle.transpose(token_priority, [1, 0, 2]), axis=1)
    valid_mask = paddle.logical_and(token_priority >= 0, token_priority < capacity)
    token_priority = paddle.masked_fill(token_priority, ~valid_mask, 0)
    dispatch_mask = F.one_hot(token_priority, capacity).cast(paddle.int32)
    valid_mask = valid_mask.unsqueeze(-1).expand(valid_mask.shape + [capacity])
    return paddle.masked_fill(dispatch_mask, ~valid_mask, 0)


PretrainedMoEGate._priority = _priority_int32
_v2_forward = DeepseekV2ForCausalLM.forward


def _v2_forward_dict(self, *args, return_dict=None, **kwargs):
    """DeepseekV2ForCausalLM.forward through its working return_dict=False path (module docstring)."""
    out = _v2_forward(self, *args, return_dict=False, **kwargs)
    return CausalLMOutputWithPast(logits=out[0]) if return_dict or return_dict is None else out


DeepseekV2ForCausalLM.forward = _v2_forward_dict


def _paddle_name(hf_name: str, prefix: str) -> tuple[str, bool]:
    """PaddleNLP's parameter name for an HF tensor, and whether it is transposed ([in, out] Linear
    layout, the [hidden, experts] router, the [hidden, vocab] lm_head)."""
    if hf_name == "lm_head.weight":
        return hf_name, True
    name = prefix + hf_name[len("model.") :]
    transpose = name.endswith(".weight") and not name.endswith(("norm.weight", "embed_tokens.weight"))
    return name, transpose


def reference_from_weights(cfg: dict, weights: dict[str, np.ndarray], keep_mtp: bool = False):
    """PaddleNLP's model for cfg's architecture, fp32, eval mode, with these HF-named weights (every
    parameter set exactly once).  Without `keep_mtp` the MTP layers are left out (module docstring)."""
    arch = cfg["architectures"][0]
    config_cls, model_cls, prefix = ARCHS[arch]
    n_mtp = cfg.get("num_nextn_predict_layers", 0) if keep_mtp else 0
    config = config_cls(
        **{k: v for k, v in cfg.items() if k not in _NOT_CONFIG},
        num_nextn_predict_layers=n_mtp,
        dtype="float32",
        use_flash_attention=False,
        use_fused_rms_norm=False,
        use_fused_rope=False,
        tensor_parallel_degree=1,
        tensor_parallel_rank=0,
        sequence_parallel=False,
        recompute=False,
    )
    paddle.set_default_dtype("float32")
    model = model_cls(config)
    model.eval()
    expected = model.state_dict()
    main_layers = cfg["num_hidden_layers"] + n_mtp
    mapped: dict[str, np.ndarray] = {}
    for hf_name, arr in weights.items():
        parts = hf_name.split(".")
        if hf_name.startswith("model.layers.") and int(parts[2]) >= main_layers:
            continue
        name, transpose = _paddle_name(hf_name, prefix)
        if name not in expected and n_mtp and any(k in name for k in ("embed_tokens", "shared_head")):
            continue  # PaddleNLP's MTP layer uses the model's own embedding and head
        mapped[name] = np.ascontiguousarray(arr.T if transpose else arr)
    for name in expected:  # PaddleNLP's MTP eh_proj is an nn.Linear with a bias; HF's has none
        if name.endswith("eh_proj.bias") and name not in mapped:
            mapped[name] = np.zeros(expected[name].shape, np.float32)
    missing, unexpected = sorted(set(expected) - set(mapped)), sorted(set(mapped) - set(expected))
    assert not missing and not unexpected, f"missing={missing[:5]} unexpected={unexpected[:5]}"
    for name, arr in mapped.items():
        assert list(arr.shape) == list(expected[name].shape), f"{name}: {arr.shape} vs {expected[name].shape}"
        expected[name].set_value(paddle.to_tensor(arr, dtype=expected[name].dtype))
    return model


def assert_drops_nothing(model) -> None:
    """Every MoE gate of the reference keeps every token (capacity = the largest expert load)."""
    gates = [m for m in model.sublayers() if isinstance(m, PretrainedMoEGate)]
    assert gates and all(g.drop_tokens is False for g in gates)
