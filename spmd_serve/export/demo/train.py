"""Trains the demo chat model: a small Llama that answers in recognisable English (issue 15), its
draft model for speculative decoding, and a small DeepSeek with an MTP layer for the `mtp` proposer.

This module owns the training recipe of the trained demo presets (checkpoint.TRAINED_DIRS), whose
results are committed: "chat" in `trained/` (`model.safetensors` in float16, `tokenizer.model`,
`training.json`), "chat-draft" in `trained/draft/` (the same recipe at a smaller size and fewer
steps, with the chat model's tokenizer, so its ids are the target's), "chat-deepseek" in
`trained/deepseek/` (export/demo/deepseek.py's dense DeepSeek with one MTP layer, the same tokenizer
and data), so serving them costs nothing at first use.  It reproduces those files on a machine with
the same source texts (training.json records their sha256):

    python -m spmd_serve.export.demo.train                          # ~25 min on one CPU core
    python -m spmd_serve.export.demo.train --preset chat-draft      # ~7 CPU-minutes; --out DIR elsewhere
    python -m spmd_serve.export.demo.train --preset chat-deepseek   # ~10 CPU-minutes

* data: training_data.py (corpus, licences, template sentences, chats; held-out parts never seen);
* tokenizer: the demo SentencePiece recipe with that text added to its training sentences;
* model: PaddleNLP's own dygraph `LlamaForCausalLM` or `DeepseekV2ForCausalLM` (the parity
  references, so the exported graphs compute the same function; the DeepSeek's criterion adds its
  MTP layer's next-next-token loss to the gradient, as PaddleNLP pretrains it), AdamW with a
  one-cycle schedule over random windows of two packed token streams, prose and chats
  (`CHAT_SHARE` of every batch), seeded; float16 weights are what is committed, and what the
  model is.

Measured on the 2-core development machine: ~1.3 s per step of 16 x 128 tokens on one core, so
training at first use (~50 steps a minute) could not reach a model that writes English; the
weights (2.6 MB) are committed instead.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from spmd_serve.export.demo.checkpoint import (
    BOS_ID,
    EOS_ID,
    TRAINED_DIR,
    TRAINED_DIRS,
    TRAINED_PRESET,
    make_config,
    train_tokenizer,
)
from spmd_serve.export.demo.training_data import (
    chat_documents,
    held_out_texts,
    prose_documents,
    sources_digest,
    tokenizer_extra,
)

CHAT_SHARE = 0.3  # of each batch's windows come from the chat stream
# Training steps per trained preset.  The draft's are what ~8 CPU-minutes allow on the development
# machine (a step of the smaller model is ~4x cheaper than the chat model's).
DEFAULT_STEPS = {TRAINED_PRESET: 1000, "chat-draft": 1600, "chat-deepseek": 650}


def _paddle_to_hf(state: dict[str, Any]) -> dict[str, np.ndarray]:
    """PaddleNLP's Llama state dict → HF names and layouts (Paddle's Linear is [in, out]), float16."""
    out = {}
    for name, tensor in state.items():
        arr = tensor.numpy()
        hf = "lm_head.weight" if name == "lm_head.weight" else "model." + name.removeprefix("llama.")
        transpose = name == "lm_head.weight" or name.endswith("_proj.weight")
        out[hf] = np.ascontiguousarray(arr.T if transpose else arr).astype(np.float16)
    return out


def _stream(docs: list[list[int]], rng: np.random.Generator) -> np.ndarray:
    """The documents shuffled and packed end to end."""
    return np.concatenate([np.asarray(docs[i], np.int64) for i in rng.permutation(len(docs))])


def _model(config: dict[str, Any]) -> Any:
    """PaddleNLP's own dygraph model for the config's architecture (LlamaForCausalLM or
    DeepseekV2ForCausalLM), float32, the plain math (no fused kernels) as the parity tests'
    PaddleNLP reference computes it."""
    from paddlenlp import transformers as nlp

    plain = dict.fromkeys(("use_flash_attention", "use_fused_rms_norm", "use_fused_rope", "fuse_attention_qkv"), False)
    hf = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    if config["architectures"] == ["LlamaForCausalLM"]:
        return nlp.LlamaForCausalLM(nlp.LlamaConfig(**hf, **plain, fuse_attention_ffn=False, dtype="float32"))
    single = {"tensor_parallel_degree": 1, "sequence_parallel": False, "recompute": False}
    return nlp.DeepseekV2ForCausalLM(nlp.DeepseekV2Config(**hf, **plain, **single, dtype="float32"))


def _checkpoint(model: Any, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The float16 tensors to commit: a Llama's with HF names and layouts; a DeepSeek's as PaddleNLP
    names them (`deepseek_v2.…`, [in, out]; its MTP layer's eh_proj bias is what tells the export
    the checkpoint's MTP convention, export/deepseek/weights.py)."""
    state = model.state_dict()
    if config["architectures"] == ["LlamaForCausalLM"]:
        return _paddle_to_hf(state)
    return {name: np.ascontiguousarray(t.numpy()).astype(np.float16) for name, t in state.items()}


def _forward(model: Any, x: Any) -> tuple[Any, Any]:
    """(loss, the MTP layers' normed rows or None) of token rows x [B, S + 1].  PaddleNLP's loss
    does not shift: the labels are the inputs moved on by one.  With MTP layers its model takes
    one more input position per layer (the embedding the last MTP row reads), and its criterion
    adds the MTP layers' next-next-token losses to the gradient (the value is the main loss)."""
    out = model(input_ids=x[:, :-1], labels=x[:, 1:], return_dict=False)  # DeepseekV2's dict path is broken
    mtp = out[-1] if getattr(model.config, "num_nextn_predict_layers", 0) else None
    return out[0], mtp


def train(
    config: dict[str, Any],
    prose: list[list[int]],
    chats: list[list[int]],
    steps: int,
    batch: int = 16,
    window: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
    held_out: list[list[int]] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, list[float]]]:
    """The config's PaddleNLP model trained on random windows of the packed prose and chat streams;
    returns its float16 weights (`_checkpoint`), the training loss every 50 steps and the mean
    losses on the `held_out` documents every 100."""
    import paddle

    paddle.seed(seed)
    model = _model(config)
    model.train()
    rng = np.random.default_rng(seed)
    streams = [_stream(prose, rng), _stream(chats, rng)]
    n_chat = round(batch * CHAT_SHARE)
    extra = config.get("num_nextn_predict_layers", 0)  # input positions the MTP layers read past the window
    sched = paddle.optimizer.lr.OneCycleLR(max_learning_rate=lr, total_steps=steps, phase_pct=0.05)
    opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=0.1)
    losses: dict[str, list[float]] = {"train_every_50_steps": [], "held_out_every_100_steps": []}
    for step in range(steps):
        rows = []
        for k in range(batch):
            stream = streams[k < n_chat]
            s = int(rng.integers(0, len(stream) - window - 1 - extra))
            rows.append(stream[s : s + window + 1 + extra])
        loss, _ = _forward(model, paddle.to_tensor(np.stack(rows)))  # rows [B, W + 1 + extra]
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            losses["train_every_50_steps"].append(round(float(loss), 4))
        if held_out and (step % 100 == 99 or step == steps - 1):
            for name, value in _mean_losses(model, held_out).items():
                losses.setdefault(f"{name}_every_100_steps", []).append(round(value, 4))
    return _checkpoint(model, config), losses


def _mean_losses(model: Any, docs: list[list[int]]) -> dict[str, float]:
    """Mean next-token negative log-likelihood over the documents (`held_out`) and, with an MTP
    layer, its mean next-next-token one (`held_out_mtp`); the model is left in training mode."""
    import paddle
    import paddle.nn.functional as F

    model.eval()
    sums: dict[str, list[float]] = {}
    with paddle.no_grad():
        for ids in docs:
            x = paddle.to_tensor([ids])
            loss, mtp = _forward(model, x)
            n = x.shape[1] - 1 - (1 if mtp is not None else 0)  # positions the main loss covers
            pairs = [("held_out", float(loss))]
            if mtp is not None:  # row i of the first MTP layer predicts token i + 2
                mtp_loss = F.cross_entropy(model.lm_head(mtp[0]), x[:, 2:].unsqueeze(-1))
                pairs.append(("held_out_mtp", float(mtp_loss)))
            for name, value in pairs:
                total = sums.setdefault(name, [0.0, 0.0])
                total[0], total[1] = total[0] + value * n, total[1] + n
    model.train()
    return {name: total / count for name, (total, count) in sums.items()}


def main(argv: list[str] | None = None) -> None:
    import sentencepiece as spm
    from safetensors.numpy import save_file

    ap = argparse.ArgumentParser(description="Train a trained demo preset (writes trained/ or trained/draft/).")
    ap.add_argument("--preset", default=TRAINED_PRESET, choices=sorted(TRAINED_DIRS))
    ap.add_argument("--out", type=Path, default=None, help="default: the preset's committed folder")
    ap.add_argument("--steps", type=int, default=None, help="default: DEFAULT_STEPS of the preset")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out = args.out or TRAINED_DIRS[args.preset]
    args.steps = args.steps or DEFAULT_STEPS[args.preset]

    config = make_config(args.preset)
    if args.preset == TRAINED_PRESET:
        proto = train_tokenizer(config["vocab_size"], tokenizer_extra())
    else:  # a draft shares the chat model's tokenizer: the same ids, byte for byte
        proto = (TRAINED_DIR / "tokenizer.model").read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=proto)

    def encode(texts: list[str]) -> list[list[int]]:
        return [[BOS_ID, *sp.encode(t), EOS_ID] for t in texts]

    prose, chats = encode(prose_documents(args.seed)), encode(chat_documents(args.seed))
    held_out = [ids[:-1] for texts in held_out_texts().values() for ids in encode(texts)]
    t0 = time.perf_counter()
    weights, losses = train(config, prose, chats, args.steps, seed=args.seed, held_out=held_out)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.preset == TRAINED_PRESET:  # the drafts use this one (checkpoint.write_demo_checkpoint)
        (args.out / "tokenizer.model").write_bytes(proto)
    save_file(weights, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(args.out / "model.safetensors", 0o644)  # safetensors writes 0600
    record = {
        "preset": args.preset,
        "steps": args.steps,
        "seed": args.seed,
        "prose_tokens": sum(map(len, prose)),
        "chat_tokens": sum(map(len, chats)),
        "seconds": round(time.perf_counter() - t0, 1),
        "sources_sha256": sources_digest(),
        **losses,
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "sources_sha256"}))


if __name__ == "__main__":
    main()
