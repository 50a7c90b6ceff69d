"""Offline demo checkpoints: HuggingFace-format Llamas (or a DeepSeek-V3-shaped model, `deepseek-tiny`)
plus a locally trained tokenizer.

This module owns `write_demo_checkpoint()`, which makes a complete model directory with no network
access (config.json, model.safetensors, a SentencePiece BPE tokenizer with a chat template, and
generation_config.json), so the server, the tests and the docs all have a model to load.  The
"chat" preset is a model trained on the demo corpus (`train.py`; its weights and tokenizer are
committed in `trained/`), the default demo: it answers in English.  The others have random weights.

The weights are random but *not* arbitrary: they are scaled so that the final logits have a
standard deviation of about 3, which keeps greedy decoding away from near-ties; tests compare
greedy tokens across implementations, and a near-tie would flip on float rounding noise.

Everything is deterministic: weights come from `numpy.random.default_rng(seed)` and the tokenizer
is trained single-threaded on the fixed corpus of `spmd_serve.export.demo.corpus`, so two calls with the
same arguments write byte-identical files.  The tokenizer does not depend on `seed`.

    python -m spmd_serve.export.demo.checkpoint OUT_DIR --preset small --seed 0
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from spmd_serve.export.demo import deepseek
from spmd_serve.export.demo.corpus import training_sentences

PRESETS: dict[str, dict[str, int]] = {
    # Seconds to make; used by the unit tests.
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
    },
    # ~33M parameters: big enough that batching and multi-GPU timings mean something.
    "small": {
        "vocab_size": 8000,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "max_position_embeddings": 4096,
    },
    # Trained (train.py, weights in trained/): small enough to commit, big enough to write English.
    "chat": {
        "vocab_size": 2048,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
    },
    # Llama-3.2-1B's shape with the demo tokenizer: ~1.0B parameters (4 GB in fp32), a realistic
    # size for speed figures (memory-bound decode).  Never built by the tests (tiny and small are).
    "1b": {
        "vocab_size": 8000,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096,
    },
}
# The chat model's draft for speculative decoding (SPECULATE_METHOD=draft_model): the tiny shape at
# the chat model's vocabulary, ~1/4 of its parameters (train.py --preset chat-draft; trained/draft/).
PRESETS["chat-draft"] = {**PRESETS["tiny"], "vocab_size": PRESETS["chat"]["vocab_size"]}
TRAINED_PRESET = "chat"
TRAINED_DIR = Path(__file__).with_name("trained")  # its committed weights and tokenizer (train.py)
# Every trained preset → where its committed weights are (train.py writes them); all of them use
# the chat preset's tokenizer (TRAINED_DIR/tokenizer.model), so a draft proposes the target's ids.
TRAINED_DIRS = {
    TRAINED_PRESET: TRAINED_DIR,
    "chat-draft": TRAINED_DIR / "draft",
    "chat-deepseek": TRAINED_DIR / "deepseek",
}
END_OF_TURN_ID = 6  # <|end|>: the trained model ends its answer with it, so it stops generation

DEMO_PRESETS = (*PRESETS, *deepseek.PRESETS)  # deepseek-tiny: export/demo/deepseek.py, with the tiny tokenizer
BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<s>", "</s>", "<unk>"
BOS_ID, EOS_ID, PAD_ID = 1, 2, 0
# Chat markers are SentencePiece user-defined symbols: they always encode to exactly one id
# (ids 3..6), whatever text surrounds them.
CHAT_MARKERS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# Roles may come in any order (e.g. user, system, user); an unknown role is a template error,
# which the serving tokenizer turns into a ValueError (HTTP 400).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported role: ' ~ message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_tokenizer(vocab_size: int, extra: list[str] | tuple[str, ...] = ()) -> bytes:
    """Train the demo SentencePiece BPE model in memory and return its serialized proto
    (`extra`: more training sentences, after the usual ones).

    Training from an iterator into a BytesIO keeps temp-file names (which SentencePiece would
    record in the proto's trainer_spec) out of the model, so the bytes are reproducible.
    """
    import sentencepiece as spm

    # SentencePiece has a process-global RNG; pin it, and train single-threaded, for determinism.
    spm.set_random_generator_seed(1234)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=itertools.chain(training_sentences(n_synthetic=2 * vocab_size), extra),
        model_writer=buf,
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,  # any UTF-8 text encodes, emoji included
        unk_id=0,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=-1,
        user_defined_symbols=CHAT_MARKERS,
        # Llama-style normalisation: keep text byte-exact (newlines, repeated spaces) so that
        # decode(encode(text)) == text; only the dummy-prefix space is added and removed.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=0.9995,  # rare characters fall back to bytes (tests rely on it)
        max_sentence_length=4096,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        num_threads=1,
        minloglevel=2,
    )
    proto = buf.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    # config.json's vocab_size must equal the tokenizer's; fail loudly if training fell short.
    if sp.get_piece_size() != vocab_size:
        raise RuntimeError(f"tokenizer trained {sp.get_piece_size()} pieces, wanted {vocab_size}")
    return proto


def make_config(preset: str) -> dict[str, Any]:
    """The HF config.json contents for a preset (a DeepSeek one's: export/demo/deepseek.py)."""
    dtype = "float16" if preset in TRAINED_DIRS else "float32"  # as model.safetensors stores it
    if preset in deepseek.PRESETS:  # the trained one has the chat tokenizer, deepseek-tiny the tiny one's
        vocab = PRESETS[TRAINED_PRESET if preset in TRAINED_DIRS else "tiny"]["vocab_size"]
        ids = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
        return deepseek.make_config(preset, vocab, ids) | {"torch_dtype": dtype}
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(DEMO_PRESETS)}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **PRESETS[preset],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": dtype,
    }


def make_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights with HF names and HF shapes ([out, in] for linears).

    Scales: linears ~ N(0, 1/fan_in) keep the residual stream O(1) through the layers; norms are
    1 + small noise; lm_head ~ N(0, 9/hidden) so the logits of the unit-RMS final hidden state
    have std ~3 (few greedy near-ties).  Tensors are drawn in a fixed order from one generator.
    """
    rng = np.random.default_rng(seed)
    h, inter = config["hidden_size"], config["intermediate_size"]
    vocab, n_layers = config["vocab_size"], config["num_hidden_layers"]
    head_dim = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def linear(out_f: int, in_f: int) -> np.ndarray:
        return normal((out_f, in_f), 1.0 / np.sqrt(in_f))

    def norm() -> np.ndarray:
        return (1.0 + normal((h,), 0.05)).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal((vocab, h), 1.0)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = linear(h, h)
        w[p + "self_attn.k_proj.weight"] = linear(kv, h)
        w[p + "self_attn.v_proj.weight"] = linear(kv, h)
        w[p + "self_attn.o_proj.weight"] = linear(h, h)
        w[p + "mlp.gate_proj.weight"] = linear(inter, h)
        w[p + "mlp.up_proj.weight"] = linear(inter, h)
        w[p + "mlp.down_proj.weight"] = linear(h, inter)
        w[p + "input_layernorm.weight"] = norm()
        w[p + "post_attention_layernorm.weight"] = norm()
    w["model.norm.weight"] = norm()
    w["lm_head.weight"] = normal((vocab, h), 3.0 / np.sqrt(h))
    return w


def _tokenizer_files(config: dict[str, Any], eos: int | list[int] = EOS_ID) -> dict[str, dict[str, Any]]:
    special = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "pad_token": UNK_TOKEN,
    }  # pad_token_id 0 is <unk>: SentencePiece has no pad piece
    tokenizer_config = {
        "tokenizer_class": "LlamaTokenizer",
        **special,
        "add_bos_token": False,  # the chat template writes BOS itself
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": BOS_ID, "eos_token_id": eos, "pad_token_id": PAD_ID}
    return {
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": special,
        "generation_config.json": generation,
    }


def write_demo_checkpoint(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the demo checkpoint for `preset` into `out_dir` (created if needed); return it."""
    from safetensors.numpy import save_file

    config = make_config(preset)
    make: Callable[[dict[str, Any], int], dict[str, np.ndarray]]
    make = deepseek.make_weights if preset in deepseek.PRESETS else make_weights
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def dump(name: str, obj: dict[str, Any]) -> None:
        (out / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    dump("config.json", config)
    trained = TRAINED_DIRS.get(preset)
    for name, obj in _tokenizer_files(config, [EOS_ID, END_OF_TURN_ID] if trained else EOS_ID).items():
        dump(name, obj)
    if trained is not None:
        if not (trained / "model.safetensors").is_file():
            missing = trained / "model.safetensors"
            raise FileNotFoundError(
                f"{missing} is missing: run python -m spmd_serve.export.demo.train --preset {preset}"
            )
        proto = (TRAINED_DIR / "tokenizer.model").read_bytes()
        shutil.copyfile(trained / "model.safetensors", out / "model.safetensors")
    else:
        proto = train_tokenizer(config["vocab_size"])
        save_file(make(config, seed), str(out / "model.safetensors"), metadata={"format": "pt"})  # what HF expects
    # HF tooling looks for tokenizer.model; PaddleNLP's LlamaTokenizer for sentencepiece.bpe.model.
    for name in ("tokenizer.model", "sentencepiece.bpe.model"):
        (out / name).write_bytes(proto)
    # safetensors creates the file 0600; make it readable like the other files (shared mounts).
    os.chmod(out / "model.safetensors", 0o644)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write the offline demo Llama checkpoint.")
    ap.add_argument("out_dir")
    ap.add_argument("--preset", default="tiny", choices=DEMO_PRESETS)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(write_demo_checkpoint(args.out_dir, args.preset, args.seed))


if __name__ == "__main__":
    main()
