"""HuggingFace `tokenizer.json` behind the tokenizer interface ServingTokenizer uses
(`USE_HF_TOKENIZER=1`, CONTRACT §2).

It reads the file with the `tokenizers` library (HF's Rust tokenizer, already a dependency of
PaddleNLP and fully offline: `Tokenizer.from_file` never touches the network), so the ids are the
ones HuggingFace's own fast tokenizer produces for any model type the file describes (byte-level
BPE as in GPT-2/Qwen2/Llama-3, SentencePiece-converted BPE with byte fallback as in Llama-2, ...),
independent of whether PaddleNLP maps the checkpoint's `tokenizer_class`.

The special-token strings (bos/eos/unk/pad, additional_special_tokens) come from
tokenizer_config.json, then special_tokens_map.json, like HF's `from_pretrained`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode(): the printable character each byte is written as."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _token_text(value: Any) -> str | None:
    """A special token as written in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _components(node: Any) -> list[str]:
    """The `type`s of a tokenizer.json component, looking inside `Sequence`s."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        subs = node.get("decoders") or node.get("pretokenizers") or []
        return [t for sub in subs for t in _components(sub)]
    return [str(node.get("type"))]


def sentencepiece_bytes(piece: str, force: bool = False) -> bytes | None:
    """The bytes of a SentencePiece-style piece: byte fallback `<0xHH>` is that byte and the word
    marker is a space; None when the piece is neither (and `force` is not set)."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    if force or "\u2581" in piece:
        return piece.replace("\u2581", " ").encode()
    return None


class HFTokenizer:
    """A `tokenizers.Tokenizer` with the PaddleNLP-tokenizer attributes ServingTokenizer reads."""

    def __init__(self, tokenizer: Any, spec: dict[str, Any], special: dict[str, Any]) -> None:
        self._tk = tokenizer
        self._byte_level = "ByteLevel" in _components(spec.get("decoder"))
        self._added: dict[int, Any] = dict(tokenizer.get_added_tokens_decoder())
        self.special_tokens_map: dict[str, Any] = {}
        for key in SPECIAL_KEYS:
            text = _token_text(special.get(key))
            if text is not None:
                self.special_tokens_map[key] = text
        extra = [t for t in (_token_text(v) for v in special.get("additional_special_tokens") or []) if t is not None]
        if extra:
            self.special_tokens_map["additional_special_tokens"] = extra
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            text = self.special_tokens_map.get(key)
            setattr(self, key, text)
            setattr(self, f"{key}_id", None if text is None else tokenizer.token_to_id(text))
        ids = {i for i, t in self._added.items() if t.special}
        ids |= {getattr(self, f"{k}_id") for k in ("bos_token", "eos_token", "unk_token", "pad_token")} - {None}
        self.all_special_ids: list[int] = sorted(ids)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> HFTokenizer:
        """Load `tokenizer.json` (+ the special-token strings) of a local model directory;
        FileNotFoundError / ValueError with a one-line message when it is missing or invalid."""
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"USE_HF_TOKENIZER=1 needs {path}, which does not exist")
        try:
            text = path.read_text(encoding="utf-8")
            spec = json.loads(text)
            tokenizer = Tokenizer.from_str(text)
        except Exception as e:  # json errors, and the Rust side's plain Exception
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"{path} is not a valid HuggingFace tokenizer.json: {first}") from None
        special: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
            f = model_dir / name
            if f.is_file():
                data = json.loads(f.read_text(encoding="utf-8"))
                if isinstance(data, dict):
                    special.update(
                        {k: v for k, v in data.items() if k in SPECIAL_KEYS or k == "additional_special_tokens"}
                    )
        return cls(tokenizer, spec, special)

    def __len__(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    def encode_ids(self, text: str) -> list[int]:
        """Ids of `text` with no BOS/EOS/post-processing added (added tokens are matched)."""
        return self._tk.encode(text, add_special_tokens=False).ids

    def with_special_tokens(self, ids: list[int]) -> list[int]:
        """`ids` framed as tokenizer.json's post-processor frames one sequence (BOS / EOS ...),
        found by encoding a probe text with and without it."""
        plain = self._tk.encode("hello", add_special_tokens=False).ids
        full = self._tk.encode("hello", add_special_tokens=True).ids
        for at in range(len(full) - len(plain) + 1):
            if plain and full[at : at + len(plain)] == plain:
                return full[:at] + list(ids) + full[at + len(plain) :]
        return full + list(ids)  # the probe vanished (never seen): take what was added as a prefix

    def decode(
        self,
        ids: list[int],
        skip_special_tokens: bool = True,
        clean_up_tokenization_spaces: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        # The Rust decode never does transformers' "clean-up" of spaces, and puts no spaces around
        # added tokens (so spaces_between_special_tokens changes nothing, as with HF's fast ones).
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        return self._tk.id_to_token(int(token_id))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token adds to the text: byte-level pieces map back through GPT-2's
        byte-to-unicode table ('Ġ' is a space), SentencePiece-style `<0xHH>` is that byte and '▁'
        a space; added tokens are their own text."""
        token_id = int(token_id)
        piece = self._tk.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id in self._added:
            return piece.encode()
        if self._byte_level:
            table = _byte_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
            return piece.encode()
        raw = sentencepiece_bytes(piece)
        if raw is not None:
            return raw
        return self._tk.decode([token_id], skip_special_tokens=False).encode()
