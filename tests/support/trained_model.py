"""A tiny Qwen2 actually trained on demo-corpus text, so its greedy margins are realistic (test helper).

Random-weight models have flat next-token distributions: in 32 greedy steps many prompts meet a
step where fp32's own top-2 logits are within 0.03, and any quantisation error flips it.  A
trained language model is peaked on text it knows.  This module trains one, seeded and
deterministic, in ~40 s on two CPU cores:

* model: tests/support/model_zoo.py's untied Qwen2 (hidden 64, 2 layers, GQA 4/2, q/k/v biases) with a
  byte vocabulary (`BYTE_OFFSET + byte`, 320 ids: 0..2 pad/bos/eos, 259.. unused);
* data: the first `NUM_LINES` hand-written lines of spmd_serve/export/demo/corpus.txt (~3 KB), which it
  learns by heart (loss ~0.15 nats/byte), the way a real model knows common text;
* training: PaddleNLP's own dygraph `Qwen2ForCausalLM` (the parity reference, so the served model
  computes the same function), AdamW with a one-cycle schedule, random 64-byte windows;
* output: the directory PaddleNLP's `save_pretrained` writes (safetensors), which `spmd_serve
  export` reads like any user's PaddleNLP checkpoint, plus the byte vocabulary as a HuggingFace
  `tokenizer.json` (byte-level, no merges), so the export calibrates its int8-KV scales on text.

`corpus_prompts` gives byte-id prompts that are prefixes of the training lines: their greedy
continuations recite the line, with fp32 top-2 margins of ~0.5 at the very least and ~7 typically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.model_zoo import ARCHS, make_weights

WEIGHTS = Path(__file__).with_name("trained_qwen2.safetensors")  # train()'s state dict, committed
BYTE_OFFSET = 3  # ids 0, 1, 2 are pad, bos, eos (model_zoo's config)
VOCAB = 320  # 3 + 256 bytes, padded to a multiple of 64
NUM_LINES = 40
CONFIG = dict(ARCHS["qwen2_untied"], vocab_size=VOCAB)


def training_text() -> bytes:
    from spmd_serve.export.demo.corpus import base_sentences

    return "\n".join(base_sentences()[:NUM_LINES]).encode("utf-8")


def encode(text: bytes) -> list[int]:
    return [b + BYTE_OFFSET for b in text]


def train(steps: int = 400, batch: int = 16, window: int = 64, lr: float = 1e-2, seed: int = 0):
    """PaddleNLP's Qwen2ForCausalLM trained on `training_text()`; returns it in eval mode."""
    import paddle

    from tests.support.paddlenlp_reference import reference_from_weights

    paddle.seed(seed)
    weights = make_weights(CONFIG, seed)
    weights["lm_head.weight"] /= 3  # start with soft logits; training sharpens them
    model = reference_from_weights(CONFIG, weights)
    model.train()
    data = np.array(encode(training_text()), np.int64)
    sched = paddle.optimizer.lr.OneCycleLR(max_learning_rate=lr, total_steps=steps, phase_pct=0.1)
    opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=0.0)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(data) - window - 1, batch)
        x = np.stack([data[s : s + window + 1] for s in starts])  # [B, W+1]
        # PaddleNLP's loss does not shift: labels are the inputs moved one byte on
        out = model(input_ids=paddle.to_tensor(x[:, :-1]), labels=paddle.to_tensor(x[:, 1:]), return_dict=True)
        out.loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
    model.eval()
    model.final_loss = float(out.loss)
    return model


def write_byte_tokenizer(out: Path) -> Path:
    """`out/tokenizer.json`: the byte vocabulary (`encode`) as a byte-level BPE without merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # GPT-2's printable stand-in of each byte (what a byte-level tokenizer's vocabulary holds)
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    stand_in = {b: chr(b) for b in printable}
    stand_in.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in stand_in)})
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{stand_in[b]: b + BYTE_OFFSET for b in range(256)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok.save(str(Path(out) / "tokenizer.json"))
    return Path(out) / "tokenizer.json"


def trained() -> object:
    """PaddleNLP's Qwen2ForCausalLM holding the committed weights of `train()` (eval mode)."""
    import paddle
    from safetensors.numpy import load_file

    from tests.support.paddlenlp_reference import reference_from_weights

    model = reference_from_weights(CONFIG, make_weights(CONFIG, 0))  # the shapes; every weight replaced
    state = load_file(str(WEIGHTS))
    missing = set(model.state_dict()) ^ set(state)
    assert not missing, f"{WEIGHTS.name} does not fit the model (retrain it): {sorted(missing)[:4]}"
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    model.eval()
    return model


def write_trained_checkpoint(out: Path) -> Path:
    """PaddleNLP's save_pretrained directory of the trained model in `out`, with the byte tokenizer."""
    from tests.support.model_zoo import write_paddlenlp

    write_paddlenlp(Path(out), trained(), "paddlenlp_safetensors")
    write_byte_tokenizer(Path(out))
    return Path(out)


def main() -> None:
    """Train again and rewrite `WEIGHTS` (after a change to `train`, `CONFIG` or the corpus lines)."""
    from safetensors.numpy import save_file

    model = train()
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    save_file(state, str(WEIGHTS), metadata={"final_loss": f"{model.final_loss:.4f}"})
    print(f"{WEIGHTS}: {len(state)} tensors, final loss {model.final_loss:.4f} nats/byte")


def corpus_prompts(n: int, seed: int = 11) -> list[list[int]]:
    """`n` prompts: prefixes (4..24 bytes) of different training lines."""
    from spmd_serve.export.demo.corpus import base_sentences

    rng = np.random.default_rng(seed)
    lines = base_sentences()[:NUM_LINES]
    picks = rng.choice(len(lines), n, replace=False)
    return [encode(lines[i].encode("utf-8")[: int(k)]) for i, k in zip(picks, rng.integers(4, 25, n))]


def long_prompts(n: int, lo: int, hi: int, seed: int = 5) -> list[list[int]]:
    """`n` prompts of `lo`..`hi` bytes: training lines back to back from a random line on, cut
    mid-line, so the greedy continuation (which recites the line) runs at positions past `lo`."""
    from spmd_serve.export.demo.corpus import base_sentences

    rng = np.random.default_rng(seed)
    lines = base_sentences()[:NUM_LINES]
    prompts = []
    for first, size in zip(rng.integers(0, NUM_LINES, n), rng.integers(lo, hi, n)):
        text, k = b"", int(first)
        while len(text) < size:
            text, k = text + lines[k % NUM_LINES].encode("utf-8") + b"\n", k + 1
        prompts.append(encode(text[: int(size)]))
    return prompts


if __name__ == "__main__":
    main()
