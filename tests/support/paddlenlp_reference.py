"""PaddleNLP reference implementations (Llama, Qwen2), for tests (helper module, not a test file).

This module owns the "ground truth" that spmd_serve's own model code is compared against:

* `load_reference_model(ckpt_dir)`: PaddleNLP's dynamic-graph `LlamaForCausalLM`, plain fp32,
  no fused kernels / flash attention, single card, with the HF safetensors weights mapped onto
  PaddleNLP's parameter names and layouts (every parameter must be set exactly once);
* `reference_from_weights(hf_cfg, weights)`: the same for any supported architecture
  (`LlamaForCausalLM` incl. Llama-3 rope scaling, `Qwen2ForCausalLM` with q/k/v biases and tied
  or untied embeddings) from HF-named numpy weights;
* `reference_greedy(model, prompt, n)`: greedy tokens + per-step logits from full, cache-free
  forward passes (the simplest possible definition of the right answer);
* `reference_generate(model, prompt, n)`: PaddleNLP's own `generate()` (KV cache path), used to
  cross-check `reference_greedy`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import paddle
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from safetensors.numpy import load_file

ARCHS = {
    "LlamaForCausalLM": (LlamaConfig, LlamaForCausalLM, "llama."),
    "Qwen2ForCausalLM": (Qwen2Config, Qwen2ForCausalLM, "qwen2."),
}


def _paddle_name_and_layout(hf_name: str, prefix: str = "llama.", tied: bool = False) -> tuple[str, bool]:
    """PaddleNLP parameter name for an HF tensor name, and whether it must be transposed.

    Paddle's nn.Linear stores weight as [in, out] (HF/torch: [out, in]), and PaddleNLP's
    LlamaLMHead stores [hidden, vocab] (checked against model.state_dict() shapes), so every
    2-D weight except the embedding table is transposed.
    """
    if hf_name == "lm_head.weight":
        return hf_name, not tied  # tied: PaddleNLP's lm_head *is* the [V, H] embedding
    if not hf_name.startswith("model."):
        raise KeyError(f"unexpected tensor in checkpoint: {hf_name}")
    name = prefix + hf_name[len("model.") :]
    return name, name.endswith("_proj.weight") and not name.endswith(".bias")


def load_reference_model(ckpt_dir: str | Path) -> LlamaForCausalLM:
    """PaddleNLP LlamaForCausalLM with the checkpoint's weights, in eval mode."""
    ckpt_dir = Path(ckpt_dir)
    hf_cfg = json.loads((ckpt_dir / "config.json").read_text(encoding="utf-8"))
    return reference_from_weights(hf_cfg, load_file(str(ckpt_dir / "model.safetensors")))


def reference_from_weights(hf_cfg: dict, weights: dict[str, np.ndarray]):
    """PaddleNLP's own model class for hf_cfg's architecture, fp32, with these HF-named weights."""
    arch = (hf_cfg.get("architectures") or ["LlamaForCausalLM"])[0]
    config_cls, model_cls, prefix = ARCHS[arch]
    tied = bool(hf_cfg.get("tie_word_embeddings", False))
    config = config_cls(
        **{k: v for k, v in hf_cfg.items() if k not in ("architectures", "torch_dtype")},
        dtype="float32",
        # The reference must be the plain math: no fused/flash kernels (not on CPU anyway, and
        # they would change rounding), no tensor parallelism, no fused QKV/FFN weight layout.
        use_flash_attention=False,
        use_fused_rms_norm=False,
        use_fused_rope=False,
        fuse_attention_qkv=False,
        fuse_attention_ffn=False,
        tensor_parallel_degree=1,
        tensor_parallel_rank=0,
        sequence_parallel=False,
        recompute=False,
    )
    model = model_cls(config)
    model.eval()

    expected = model.state_dict()
    weights = dict(weights)
    if tied:  # one tensor, two names in PaddleNLP's state_dict
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    mapped: dict[str, np.ndarray] = {}
    for hf_name, arr in weights.items():
        name, transpose = _paddle_name_and_layout(hf_name, prefix, tied)
        if name in mapped:
            raise KeyError(f"two checkpoint tensors map to {name}")
        mapped[name] = np.ascontiguousarray(arr.T if transpose else arr)
    missing = sorted(set(expected) - set(mapped))
    unexpected = sorted(set(mapped) - set(expected))
    assert not missing and not unexpected, f"missing={missing} unexpected={unexpected}"
    for name, arr in mapped.items():
        want = list(expected[name].shape)
        assert list(arr.shape) == want, f"{name}: checkpoint {list(arr.shape)} vs model {want}"
        # set_value copies in place; the parameter keeps its dtype (fp32).
        expected[name].set_value(paddle.to_tensor(arr, dtype=expected[name].dtype))
    return model


@paddle.no_grad()
def _last_logits(model: LlamaForCausalLM, ids: list[int]) -> np.ndarray:
    x = paddle.to_tensor([ids], dtype="int64")
    out = model(input_ids=x, use_cache=False, return_dict=True)
    return out.logits[0, -1].astype("float32").numpy()


@paddle.no_grad()
def reference_logits(model: LlamaForCausalLM, prompt: list[int], generated: list[int]) -> np.ndarray:
    """PaddleNLP logits predicting each generated token, from one forward pass: [n, V]."""
    ids = paddle.to_tensor([prompt + generated[:-1]], dtype="int64")
    logits = model(input_ids=ids, use_cache=False, return_dict=True).logits
    return logits[0, len(prompt) - 1 :].numpy()


@paddle.no_grad()
def token_nll(model: LlamaForCausalLM, ids: list[int]) -> np.ndarray:
    """Negative log-likelihood of each of ids[1:] given the ones before it, one forward pass: [n-1]."""
    logits = model(input_ids=paddle.to_tensor([ids], dtype="int64"), use_cache=False, return_dict=True).logits[0]
    x = logits.numpy()[:-1].astype(np.float64)
    lse = x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))
    return lse - x[np.arange(len(ids) - 1), ids[1:]]


def reference_greedy(
    model: LlamaForCausalLM, prompt_ids: list[int], max_new_tokens: int
) -> tuple[list[int], np.ndarray]:
    """Greedy decoding by full forward passes (no KV cache), never stopping at EOS.

    Returns the generated ids and the logits each one was picked from, [max_new_tokens, vocab].
    """
    model.eval()
    ids = [int(t) for t in prompt_ids]
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    for _ in range(max_new_tokens):
        step = _last_logits(model, ids)
        nxt = int(np.argmax(step))
        logits.append(step)
        tokens.append(nxt)
        ids.append(nxt)
    return tokens, np.stack(logits) if logits else np.zeros((0, model.config.vocab_size), np.float32)


@paddle.no_grad()
def reference_generate(
    model: LlamaForCausalLM, prompt_ids: list[int], max_new_tokens: int, mask_eos: bool = False
) -> list[int]:
    """PaddleNLP's own greedy generate() (with its KV cache), exactly max_new_tokens tokens.

    mask_eos=False never stops at EOS but may pick it (like an engine's ignore_eos);
    mask_eos=True removes EOS from the choices (PaddleNLP's min_new_tokens, like a request whose
    min_dec_len equals max_dec_len).
    """
    model.eval()
    x = paddle.to_tensor([list(prompt_ids)], dtype="int64")
    # 3.0.0b4's generate() needs an explicit 2-D int64 attention mask here.  Without masking we
    # pass an EOS id that cannot be generated (-1): min_new_tokens would mask EOS out of the
    # logits, which disagrees with reference_greedy whenever EOS is the argmax -- it is, at step
    # 6 of one of the test prompts.
    mask = paddle.ones_like(x, dtype="int64")
    eos = (
        {"eos_token_id": model.config.eos_token_id, "min_new_tokens": max_new_tokens}
        if mask_eos
        else {"eos_token_id": -1}
    )
    out = model.generate(
        input_ids=x,
        attention_mask=mask,
        decode_strategy="greedy_search",
        max_new_tokens=max_new_tokens,
        use_cache=True,
        pad_token_id=model.config.pad_token_id,
        bos_token_id=model.config.bos_token_id,
        **eos,
    )
    ids = out[0] if isinstance(out, (tuple, list)) else out
    return [int(t) for t in ids.numpy()[0].tolist()]
