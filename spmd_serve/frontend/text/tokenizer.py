"""The serving tokenizer: text/chat messages -> prompt ids, and ids -> text.

This module owns `ServingTokenizer`, the only tokenizer the HTTP front end talks to.  It wraps
PaddleNLP's `AutoTokenizer` (loaded from the local model directory; it makes no network calls for
a directory that holds tokenizer_config.json + the tokenizer files), or with USE_HF_TOKENIZER=1
the directory's HuggingFace tokenizer.json (`hf_tokenizer.HFTokenizer`), and adds what serving
needs:

* the model's EOS ids gathered from generation_config.json, config.json and the tokenizer;
* the special tokens the tokenizer itself puts around a text (`encode(text, add_special_tokens=True)`:
  its BOS / EOS as tokenizer_config.json's `add_bos_token` / `add_eos_token` say, as HF's
  `tokenizer(text)`, vLLM's completions and llama.cpp do; never one the model's config did not ask for);
* the chat template (`chat_template`: found and rendered as HuggingFace does, in a *sandboxed*
  Jinja environment because templates ship with possibly untrusted checkpoints);
* request validation that raises ValueError with a readable message (the HTTP layer maps
  ValueError to 400);
* `detokenizer()`, a streaming decoder whose deltas add up to `decode()` exactly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jinja2

from spmd_serve.frontend.text import chat_template, paddlenlp_import
from spmd_serve.frontend.text.detokenizer import IncrementalDetokenizer, join_with_specials
from spmd_serve.frontend.text.hf_tokenizer import HFTokenizer, sentencepiece_bytes


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def _added_token_splitter(tok: Any) -> re.Pattern[str] | None:
    """For a PaddleNLP byte-level BPE tokenizer with added tokens (Qwen2's `<|im_start|>`, ...):
    a regex that cuts text at them, so `encode` can do what HF's tokenizers do: every added token
    is one id and the text between them is tokenized as it is.  PaddleNLP's own `tokenize` splits
    an added token that is not also a special one ('<', '|', 'im', ...) and strips the whitespace
    around the special ones, so ChatML's "<|im_end|>\n<|im_start|>" lost its newline.
    SentencePiece tokenizers are left alone (their added-token handling differs: dummy prefix)."""
    added = getattr(tok, "added_tokens_encoder", None) or {}
    if not added or getattr(tok, "sp_model", None) is not None:
        return None
    return re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")


_PROBE = -(2**40)  # an id no tokenizer has: where the text's own ids go in the probe


def _around_text(tok: Any, tok_cfg: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after a text's own when asked to add special tokens:
    PaddleNLP's `build_inputs_with_special_tokens` (which follows add_bos_token / add_eos_token),
    tokenizer.json's post-processor; tokenizer_config.json's explicit add_bos_token /
    add_eos_token win, as transformers rebuilds the post-processor from them."""
    if isinstance(tok, HFTokenizer):
        ids = tok.with_special_tokens([_PROBE])
    else:
        ids = [int(i) for i in tok.build_inputs_with_special_tokens([_PROBE])]
    at = ids.index(_PROBE)
    prefix, suffix = ids[:at], ids[at + 1 :]
    edges = (("add_bos_token", tok.bos_token_id, prefix), ("add_eos_token", tok.eos_token_id, suffix))
    for key, special, edge in edges:
        flag = tok_cfg.get(key)
        if isinstance(flag, bool) and special is not None:
            edge[:] = [i for i in edge if i != special]
            if flag:
                edge.insert(0 if edge is prefix else len(edge), int(special))
    return prefix, suffix


class ServingTokenizer:
    """Tokenizer + chat template + EOS ids of one model directory."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template_source: str | None,
        eos_token_ids: list[int],
        bos_token_id: int | None,
        around_text: tuple[list[int], list[int]] | None = None,
    ) -> None:
        self._tok = tokenizer
        self.eos_token_ids = eos_token_ids
        self.bos_token_id = bos_token_id
        # what encode(add_special_tokens=True) adds (from_model_dir passes tokenizer_config's say)
        self._prefix, self._suffix = around_text if around_text is not None else _around_text(tokenizer, {})
        # Ids decode() drops (bos/eos/unk/pad); the detokenizer drops them the same way.  Every eos
        # id too: a model whose answer ends with an end-of-turn piece (the demo's <|end|>) stops on
        # it, and like vLLM we do not return the text of the token that stopped generation.
        self.special_token_ids: frozenset[int] = frozenset(
            int(i) for i in [*tokenizer.all_special_ids, *eos_token_ids] if i is not None
        )
        # Fast path for decode(): for a plain SentencePiece LlamaTokenizer (no added tokens),
        # PaddleNLP's decode with specials skipped is exactly sp_model.decode(ids), at ~1/20 of
        # the cost; streaming calls decode twice per token per request, so this matters.
        sp = getattr(tokenizer, "sp_model", None)
        self._sp = (
            sp
            if type(tokenizer).__name__ == "LlamaTokenizer" and not getattr(tokenizer, "added_tokens_encoder", None)
            else None
        )
        self._hf = tokenizer if isinstance(tokenizer, HFTokenizer) else None
        self._added_split = None if self._hf is not None else _added_token_splitter(tokenizer)
        # Special-token strings the chat template sees (bos_token, eos_token, ...), as HF passes.
        self._special_strings: dict[str, Any] = {
            k: v for k, v in dict(getattr(tokenizer, "special_tokens_map", {}) or {}).items() if v is not None
        }
        self.chat_template_source = chat_template_source  # (what tool-call format the model writes)
        self._template: jinja2.Template | None = (
            chat_template.compile_template(chat_template_source) if chat_template_source else None
        )

    @classmethod
    def from_model_dir(cls, path: str | Path, use_hf_tokenizer: bool = False) -> ServingTokenizer:
        """Load from a local HF/PaddleNLP-style model directory (never the network):
        PaddleNLP's tokenizer, or with `use_hf_tokenizer` the directory's tokenizer.json."""
        model_dir = Path(path)
        tok_cfg = _read_json(model_dir / "tokenizer_config.json")
        template = chat_template.find_template(model_dir, tok_cfg)
        if template:  # our own one-line error, before PaddleNLP compiles (and raises) it too
            chat_template.compile_template(template)
        if use_hf_tokenizer:
            tok: Any = HFTokenizer.from_model_dir(model_dir)
        else:
            AutoTokenizer = paddlenlp_import.auto_tokenizer()  # noqa: N806 (heavy import; only when loading)

            if not (model_dir / "tokenizer_config.json").is_file():
                # Without it AutoTokenizer would treat the path as a hub model name and go online.
                raise FileNotFoundError(f"{model_dir}/tokenizer_config.json not found")
            try:
                tok = AutoTokenizer.from_pretrained(str(model_dir))
            except jinja2.TemplateError as e:  # PaddleNLP's own compile of chat_template.json
                raise ValueError(f"PaddleNLP rejected the chat template: {e}".splitlines()[0]) from e
        # generation_config.json is what generation stops on; config.json and the tokenizer's
        # own eos are added in case a model lists several (e.g. end-of-turn tokens).
        eos: list[int] = []
        for src in (
            _read_json(model_dir / "generation_config.json").get("eos_token_id"),
            _read_json(model_dir / "config.json").get("eos_token_id"),
            tok.eos_token_id,
        ):
            eos += [i for i in _as_id_list(src) if i not in eos]
        bos = tok.bos_token_id
        return cls(tok, template, eos, None if bos is None else int(bos), _around_text(tok, tok_cfg))

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` (special-token strings in it are recognised); with
        `add_special_tokens`, inside the BOS / EOS the tokenizer's own settings add."""
        if add_special_tokens:
            return self._prefix + self.encode(text) + self._suffix
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        if self._hf is not None:
            return self._hf.encode_ids(text)
        if self._added_split is None:
            return [int(i) for i in self._tok.convert_tokens_to_ids(self._tok.tokenize(text))]
        ids: list[int] = []
        for i, part in enumerate(self._added_split.split(text)):  # odd parts are added tokens
            if i % 2:
                ids.append(int(self._tok.added_tokens_encoder[part]))
            elif part:
                ids += [int(t) for t in self._tok.convert_tokens_to_ids(self._tok.tokenize(part))]
        return ids

    def decode(
        self, ids: list[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str:
        """Text of `ids` with special tokens skipped (or written, as `join_with_specials` writes
        them) and no whitespace 'clean-up' (which would break streaming: the deltas must add up to
        exactly this).  `spaces_between_special_tokens` also reaches PaddleNLP's decode, which joins
        the text around an added token with a space unless it is false; tokenizer.json's tokenizers
        put no spaces there (HF's and vLLM's rule for fast tokenizers)."""
        spaces_between_special_tokens &= self._hf is None
        if not skip_special_tokens:
            sep = " " if spaces_between_special_tokens else ""
            run_text = lambda run: self.decode(run, True, spaces_between_special_tokens)  # noqa: E731
            return join_with_specials(run_text, ids, self.special_token_ids, self.special_text, sep)
        ids = [int(i) for i in ids if int(i) not in self.special_token_ids]
        if not ids:
            return ""
        if self._sp is not None:
            return self._sp.decode(ids)
        return self._tok.decode(
            ids,
            skip_special_tokens=True,
            clean_up_tokenization_spaces=False,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )

    def pieces(self, ids: list[int]) -> list[str]:
        """The vocabulary's own strings for `ids` ("▁Hello", "Ġworld", "<0xE4>"), as vLLM's /tokenize gives them."""
        return [str(self._tok.convert_ids_to_tokens(int(i))) for i in ids]

    def special_text(self, token_id: int) -> str:
        """How a special token reads when written out: its own string."""
        return self.token_bytes(token_id).decode("utf-8", "replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token contributes to the text (for logprobs): SentencePiece's byte
        fallback pieces `<0xHH>` are that byte, its word marker is a space (tokenizer.json:
        see HFTokenizer.token_bytes)."""
        if self._hf is not None:
            return self._hf.token_bytes(token_id)
        piece = self._tok.convert_ids_to_tokens(int(token_id))
        if not isinstance(piece, str):
            return b""
        if int(token_id) in self.special_token_ids:
            return piece.encode()
        raw = sentencepiece_bytes(piece, force=self._sp is not None)
        if raw is not None:
            return raw
        return self._tok.convert_tokens_to_string([piece]).encode()

    def render_chat(self, messages: list[dict], system: str | None = None, **options: Any) -> str:
        """The chat template applied to `messages` (with `system` as a leading system message),
        ending with the assistant generation prompt (`options`: chat_template.render's)."""
        if self._template is None:
            raise ValueError("this model has no chat template; send 'text' instead of 'messages'")
        msgs = chat_template.normalize_messages(messages, system)
        try:
            return chat_template.render(self._template, msgs, self._special_strings, **options)
        except jinja2.TemplateError as e:  # includes raise_exception() and sandbox violations
            raise ValueError(f"chat template rejected the messages: {e}") from e
        except (TypeError, KeyError, AttributeError, IndexError) as e:
            raise ValueError(f"chat template failed on the messages: {e!r}") from e

    def encode_prompt(
        self, *, text: str | None = None, messages: list[dict] | None = None, system: str | None = None, **chat: Any
    ) -> list[int]:
        """Prompt ids for a request: exactly one of `text` (one user turn) or `messages`.

        With a chat template both go through it (it writes BOS).  Without one, `text` is
        encoded with the special tokens the tokenizer adds itself, as the original tool does
        (and `system`, if any, prepended as plain text on its own line); `messages` then have no
        defined rendering and are rejected.
        """
        if (text is None) == (messages is None):
            raise ValueError("exactly one of 'text' and 'messages' must be given")
        if text is not None and not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        if self._template is not None:
            msgs = messages if messages is not None else [{"role": "user", "content": text}]
            return self.encode(self.render_chat(msgs, system=system, **chat))
        if messages is not None or text is None:
            raise ValueError("this model has no chat template; send 'text' instead of 'messages'")
        if system is not None:
            if not isinstance(system, str):
                raise ValueError(f"system must be a string, got {type(system).__name__}")
            text = f"{system}\n{text}"
        return self.encode(text, add_special_tokens=True)

    def detokenizer(
        self,
        prompt_ids: list[int],
        continue_prompt: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> IncrementalDetokenizer:
        """A fresh streaming decoder for one request's output ids (`continue_prompt`: the text
        reads as the prompt's continuation, leading space included; the rest: `decode`'s)."""
        spaces = spaces_between_special_tokens and self._hf is None  # as decode() decides
        return IncrementalDetokenizer(self, prompt_ids, continue_prompt, skip_special_tokens, spaces)
