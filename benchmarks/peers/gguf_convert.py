"""A HuggingFace-format Llama checkpoint (safetensors + SentencePiece tokenizer.model) → GGUF.

This module owns the conversion the peer comparison serves with llama.cpp: the same tensors and
tokenizer our demo checkpoints hold, written with `gguf-py` (the copy vendored in the
llama-cpp-python sdist, or PyPI's `gguf`) in F32, F16 or Q8_0.  It does what llama.cpp's own
`convert_hf_to_gguf.py` does for a SentencePiece Llama, without its torch dependency:

* names: HF tensor names → GGUF names (gguf-py's LLAMA table, `GLOBAL_NAMES` / `LAYER_NAMES`);
* q_proj / k_proj rows permuted (`permute_qk`): HF applies RoPE to the two halves of each head
  (rotate_half), llama.cpp's LLAMA rope type to adjacent pairs, so the rows are interleaved;
* dtypes as convert_hf_to_gguf's `--outtype`: 1-D tensors (norms) stay F32, 2-D weights (the
  embedding and lm_head included) become F16 or Q8_0;
* the vocabulary: every SentencePiece piece with its score and type (the proto's piece types are
  GGUF's token types), BOS/EOS/UNK ids, add_bos/add_eos from tokenizer_config.json and its chat
  template, so llama.cpp tokenizes text as our server does.

    python -m benchmarks.peers.gguf_convert CKPT_DIR OUT.gguf --outtype f32|f16|q8_0 [--gguf-py DIR]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import numpy as np

OUTTYPES = ("f32", "f16", "q8_0")


def import_gguf(gguf_py: Path | None = None) -> ModuleType:
    """gguf-py from `gguf_py` (a llama.cpp checkout's gguf-py/ dir) when given, else PyPI's `gguf`."""
    if gguf_py is not None and str(gguf_py) not in sys.path:
        sys.path.insert(0, str(gguf_py))
    import gguf

    return gguf


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q or k projection [n_head * d, in] from HF's rotate-half order to llama.cpp's
    adjacent-pair order: within each head, row j (< d/2) and row j + d/2 become rows 2j, 2j+1
    (convert_hf_to_gguf's LlamaModel.permute)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# HF Llama tensor names → GGUF names (gguf-py's MODEL_ARCH.LLAMA table, written out: it is short,
# and the converter's naming is then testable without gguf-py; tests cross-check the two).
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def gguf_tensor_name(hf_name: str) -> str:
    """The GGUF name of an HF Llama tensor ('model.layers.3.self_attn.q_proj.weight' → 'blk.3.attn_q.weight')."""
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    m = _LAYER.fullmatch(hf_name)
    if m is None or m.group(2) not in LAYER_NAMES:
        raise ValueError(f"no GGUF name for tensor {hf_name!r}")
    return f"blk.{m.group(1)}.{LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def convert_tensors(gguf: ModuleType, cfg: dict, weights: dict[str, np.ndarray], outtype: str
                    ) -> Iterator[tuple[str, np.ndarray, object]]:
    """(GGUF name, data, GGMLQuantizationType) for each tensor, in the checkpoint's order; data is
    already quantised for Q8_0 (uint8 blocks, as gguf-py's writer takes them)."""
    qt = gguf.GGMLQuantizationType
    want = {"f32": qt.F32, "f16": qt.F16, "q8_0": qt.Q8_0}[outtype]
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    for hf_name, w in weights.items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue                                   # recomputed by llama.cpp from rope.freq_base
        w = np.asarray(w, dtype=np.float32)
        if hf_name.endswith("q_proj.weight"):
            w = permute_qk(w, n_head)
        elif hf_name.endswith("k_proj.weight"):
            w = permute_qk(w, n_kv)
        kind = qt.F32 if w.ndim == 1 else want
        if kind == qt.Q8_0 and w.shape[-1] % 32:
            kind = qt.F16                              # Q8_0 blocks are 32 wide (convert_hf_to_gguf falls back too)
        yield gguf_tensor_name(hf_name), gguf.quants.quantize(w, kind), kind


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if b < 0x80:
            return value, i


def _fields(buf: bytes) -> Iterator[tuple[int, int | float | bytes]]:
    """(field number, value) of a protobuf message: varints, 32-bit floats, length-delimited bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 5:
            value, i = float(np.frombuffer(buf, "<f4", 1, i)[0]), i + 4
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, value


def sentencepiece_vocab(proto: bytes) -> tuple[list[bytes], list[float], list[int]]:
    """Pieces, scores and types of a serialized SentencePiece ModelProto (its `pieces`, field 1:
    piece 1, score 2, type 3).  The proto's piece types — NORMAL 1, UNKNOWN 2, CONTROL 3,
    USER_DEFINED 4, UNUSED 5, BYTE 6 — are GGUF's TokenType.  Read from the wire format directly:
    sentencepiece's generated _pb2 module refuses many installed protobuf runtimes."""
    pieces: list[bytes] = []
    scores: list[float] = []
    types: list[int] = []
    for field, value in _fields(proto):
        if field != 1:
            continue
        rec = {1: b"", 2: 0.0, 3: 1, **dict(_fields(value))}   # proto defaults: score 0, type NORMAL
        pieces.append(rec[1])
        scores.append(float(rec[2]))
        types.append(int(rec[3]))
    return pieces, scores, types


def sentencepiece_adds_prefix(proto: bytes) -> bool:
    """normalizer_spec.add_dummy_prefix (ModelProto field 3, its field 3; default true): llama.cpp's
    SPM tokenizer prepends the space only when GGUF's add_space_prefix says so."""
    for field, value in _fields(proto):
        if field == 3:
            return bool(dict(_fields(value)).get(3, 1))
    return True


def _file_type(gguf: ModuleType, outtype: str) -> int:
    ft = gguf.LlamaFileType
    return {"f32": ft.ALL_F32, "f16": ft.MOSTLY_F16, "q8_0": ft.MOSTLY_Q8_0}[outtype]


def write_header(gguf: ModuleType, writer, cfg: dict, tok_cfg: dict, ckpt: Path, outtype: str) -> None:
    """Model hyper-parameters and the tokenizer, as convert_hf_to_gguf writes them for a Llama."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    writer.add_name(ckpt.name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_file_type(_file_type(gguf, outtype))

    proto = (ckpt / "tokenizer.model").read_bytes()
    pieces, scores, types = sentencepiece_vocab(proto)
    if len(pieces) != cfg["vocab_size"]:
        raise ValueError(f"tokenizer has {len(pieces)} pieces, config.json says vocab_size {cfg['vocab_size']}")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        if cfg.get(key) is not None:
            add(int(cfg[key]))
    unk = [i for i, t in enumerate(types) if t == gguf.TokenType.UNKNOWN]
    if unk:
        writer.add_unk_token_id(unk[0])
    if cfg.get("pad_token_id") is not None:
        writer.add_pad_token_id(int(cfg["pad_token_id"]))
    writer.add_add_space_prefix(sentencepiece_adds_prefix(proto))
    writer.add_add_bos_token(bool(tok_cfg.get("add_bos_token", True)))
    writer.add_add_eos_token(bool(tok_cfg.get("add_eos_token", False)))
    if tok_cfg.get("chat_template"):
        writer.add_chat_template(tok_cfg["chat_template"])


def load_checkpoint(ckpt: Path) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """config.json, tokenizer_config.json and every safetensors tensor of an HF Llama directory."""
    from safetensors.numpy import load_file

    cfg = json.loads((ckpt / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(f"{ckpt}: model_type {cfg.get('model_type')!r}, this converter handles llama only")
    if cfg.get("rope_scaling"):
        raise ValueError(f"{ckpt}: rope_scaling is not handled by this converter")
    tok_path = ckpt / "tokenizer_config.json"
    tok_cfg = json.loads(tok_path.read_text()) if tok_path.is_file() else {}
    weights: dict[str, np.ndarray] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    if not weights:
        raise FileNotFoundError(f"{ckpt}: no *.safetensors")
    return cfg, tok_cfg, weights


def convert(ckpt: Path, out: Path, outtype: str, gguf_py: Path | None = None) -> Path:
    """Write `out` (atomically: a .part file renamed) and return it."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not one of {OUTTYPES}")
    gguf = import_gguf(gguf_py)
    cfg, tok_cfg, weights = load_checkpoint(Path(ckpt))
    part = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(str(part), "llama")
    write_header(gguf, writer, cfg, tok_cfg, Path(ckpt), outtype)
    for name, data, kind in convert_tensors(gguf, cfg, weights, outtype):
        writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    part.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--outtype", default="f32", choices=OUTTYPES)
    ap.add_argument("--gguf-py", type=Path, default=None, help="a llama.cpp gguf-py/ directory (else PyPI's gguf)")
    args = ap.parse_args(argv)
    print(convert(args.checkpoint, args.out, args.outtype, args.gguf_py))
    return 0


if __name__ == "__main__":
    sys.exit(main())
