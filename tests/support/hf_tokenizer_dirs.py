"""Tokenizer directories in HuggingFace's format, written offline by the tests.

`write_byte_level_dir` trains a small byte-level BPE (GPT-2/Qwen2/Llama-3 style: 'Ġ' for a space,
every byte reachable) on the demo corpus with the `tokenizers` library and writes tokenizer.json
plus vocab.json/merges.txt (what PaddleNLP's Qwen2Tokenizer reads), tokenizer_config.json with a
chat template, and generation_config.json.  The two templates are those of Qwen2.5-Instruct
(ChatML) and Llama-3-Instruct, as shipped in those checkpoints' tokenizer_config.json.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from spmd_serve.export.demo.corpus import training_sentences

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
EXTRA_TEXT = [
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "Emoji 🎉🍕☕️ 👍🏽 🌍 😊",
    "Ünïcödé ümlaut π ≈ 3.14159 ∞ 结束。",
]

QWEN2_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
    '\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    "        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)
# DeepSeek-V3.1's way of thinking, after Qwen2.5's template (QWEN2_TEMPLATE + THINKING): the variable `thinking`
# opens a think block in the generation prompt; without it an empty one is closed there (thinking off)
THINKING = (
    "{%- if add_generation_prompt %}"
    "{{- '<think>\\n' if thinking is defined and thinking else '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

# HF-only conveniences a template may use: loop controls, tojson (not HTML-escaped, non-ASCII
# kept), strftime_now, raise_exception, a `tools` variable that is defined (None).
FEATURES_TEMPLATE = (
    "{%- if tools is not defined %}{{ raise_exception('tools must be defined') }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}{% continue %}{% endif %}"
    "{%- if m.content == 'STOP' %}{% break %}{% endif %}"
    "{{ loop.index }}:{{ m | tojson }}\n"
    "{%- endfor %}"
    "[{{ strftime_now('%Y') }}]{{ eos_token }}"
    "{%- if add_generation_prompt %}<gen>{% endif %}"
)


# Qwen2's pre-tokenizer split (its tokenizer.json: Split(this regex) then ByteLevel without
# GPT-2's regex); PaddleNLP's Qwen2Tokenizer splits with the same pattern.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@lru_cache(maxsize=4)
def train_byte_level(specials: tuple[str, ...], vocab_size: int = 700) -> str:
    """tokenizer.json text of a byte-level BPE trained on the demo corpus (deterministic)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    if "<|im_end|>" in specials:
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(list(training_sentences(n_synthetic=2000, repeats=1)) + EXTRA_TEXT * 5, trainer)
    return tk.to_str()


def write_byte_level_dir(
    out: Path, flavour: str, extra_config: dict[str, Any] | None = None, generation_config: dict[str, Any] | None = None
) -> Path:
    """flavour 'qwen2' (ChatML template, eos <|im_end|> and <|endoftext|>) or 'llama3'."""
    out.mkdir(parents=True, exist_ok=True)
    specials = QWEN_SPECIALS if flavour == "qwen2" else LLAMA3_SPECIALS
    text = train_byte_level(tuple(specials))
    (out / "tokenizer.json").write_text(text, encoding="utf-8")
    spec = json.loads(text)
    vocab = spec["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    ids = {t: vocab[t] for t in specials}
    if flavour == "qwen2":
        config = {
            "tokenizer_class": "Qwen2Tokenizer",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "errors": "replace",
            "chat_template": QWEN2_TEMPLATE,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 32768,
        }
        gen = {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "bos_token_id": ids["<|endoftext|>"]}
    else:
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "chat_template": LLAMA3_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 8192,
        }
        gen = {"eos_token_id": [ids["<|end_of_text|>"], ids["<|eot_id|>"]], "bos_token_id": ids["<|begin_of_text|>"]}
    # As real checkpoints do: PaddleNLP's slow tokenizers learn the added tokens from here.
    config["added_tokens_decoder"] = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t, i in ids.items()
    }
    config.update(extra_config or {})
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1), encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(generation_config or gen), encoding="utf-8")
    return out


def sentencepiece_tokenizer_json(model_file: Path, user_symbols: list[str]) -> str:
    """tokenizer.json text of a SentencePiece BPE model, built as transformers' LlamaConverter
    builds it (Llama/Mistral type): Metaspace pre-tokenizer ('▁' for a space, prepended to the
    first piece only), BPE with byte fallback (`<0xHH>` pieces) and merges recovered from the
    vocabulary (every split of a piece into two pieces, ordered by the merged piece's score);
    the model's user-defined symbols become added tokens.  Made without protobuf."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for piece in sorted(vocab, key=lambda p: -sp.get_score(vocab[p])):
        merges += sorted(
            ((piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab),
            key=lambda m: (vocab[m[0]], vocab[m[1]]),
        )
    tk = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=sp.id_to_piece(sp.unk_id()), byte_fallback=True, fuse_unk=True)
    )
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = [sp.id_to_piece(i) for i in (sp.unk_id(), sp.bos_id(), sp.eos_id())]
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tk.add_tokens([AddedToken(t, normalized=False, special=False) for t in user_symbols])
    return tk.to_str()
