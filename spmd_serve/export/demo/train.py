"""Trains the demo chat model: a small Llama that answers in recognisable English (issue 15), and
its draft model for speculative decoding.

This module owns the training recipe of the trained demo presets (checkpoint.TRAINED_DIRS), whose
results are committed: "chat" in `trained/` (`model.safetensors` in float16, `tokenizer.model`,
`training.json`), "chat-draft" in `trained/draft/` (the same recipe at a smaller size and fewer
steps, with the chat model's tokenizer, so its ids are the target's), so serving them costs nothing
at first use.  It reproduces those files on a machine with the same source texts (training.json
records their sha256):

    python -m spmd_serve.export.demo.train                       # ~25 min on one CPU core
    python -m spmd_serve.export.demo.train --preset chat-draft   # ~7 CPU-minutes; --out DIR elsewhere

* data: training_data.py (corpus, licences, template sentences, chats; held-out parts never seen);
* tokenizer: the demo SentencePiece recipe with that text added to its training sentences;
* model: PaddleNLP's own dygraph `LlamaForCausalLM` (the parity reference, so the exported graphs
  compute the same function), AdamW with a one-cycle schedule over random windows of two packed
  token streams, prose and chats (`CHAT_SHARE` of every batch), seeded; float16 weights are what is
  committed, and what the model is.

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
DEFAULT_STEPS = {TRAINED_PRESET: 1000, "chat-draft": 1600}


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
    """PaddleNLP's LlamaForCausalLM trained on random windows of the packed prose and chat streams;
    returns its float16 weights with HF names, the training loss every 50 steps and the mean loss
    on the `held_out` documents every 100."""
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(seed)
    # the plain math (no fused kernels), as the parity tests' PaddleNLP reference computes it
    plain = dict.fromkeys(("use_flash_attention", "use_fused_rms_norm", "use_fused_rope", "fuse_attention_qkv"), False)
    hf = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    model = LlamaForCausalLM(LlamaConfig(**hf, **plain, fuse_attention_ffn=False, dtype="float32"))
    model.train()
    rng = np.random.default_rng(seed)
    streams = [_stream(prose, rng), _stream(chats, rng)]
    n_chat = round(batch * CHAT_SHARE)
    sched = paddle.optimizer.lr.OneCycleLR(max_learning_rate=lr, total_steps=steps, phase_pct=0.05)
    opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=0.1)
    losses: dict[str, list[float]] = {"train_every_50_steps": [], "held_out_every_100_steps": []}
    for step in range(steps):
        rows = []
        for k in range(batch):
            stream = streams[k < n_chat]
            s = int(rng.integers(0, len(stream) - window - 1))
            rows.append(stream[s : s + window + 1])
        x = np.stack(rows)  # [B, W+1]
        # PaddleNLP's loss does not shift: the labels are the inputs moved on by one
        out = model(input_ids=paddle.to_tensor(x[:, :-1]), labels=paddle.to_tensor(x[:, 1:]), return_dict=True)
        out.loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            losses["train_every_50_steps"].append(round(float(out.loss), 4))
        if held_out and (step % 100 == 99 or step == steps - 1):
            losses["held_out_every_100_steps"].append(round(_mean_loss(model, held_out), 4))
    return _paddle_to_hf(model.state_dict()), losses


def _mean_loss(model: Any, docs: list[list[int]]) -> float:
    """Mean next-token negative log-likelihood over the documents (model left in training mode)."""
    import paddle

    model.eval()
    total = count = 0.0
    with paddle.no_grad():
        for ids in docs:
            x = paddle.to_tensor([ids])
            out = model(input_ids=x[:, :-1], labels=x[:, 1:], return_dict=True)
            total += float(out.loss) * (len(ids) - 1)
            count += len(ids) - 1
    model.train()
    return total / count


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
