"""vLLM's request extras that change what is generated or how it is written out, which this server
does not build: accepted only at their neutral value (the one that changes nothing, e.g.
`bad_words: []`, `use_beam_search: false`) and otherwise refused by name, by the OpenAI API
(openai.fields, among its other not-implemented fields) and by the native one (native.protocol:
a body without "model" that carries one was meant for a vLLM-style server).  Also the extras
the OpenAI API honours and the native one takes only at their neutral value.

Pure data and two helpers, shared by both protocols (which import no other protocol).
"""

from __future__ import annotations

from typing import Any

from spmd_serve.frontend.common.parsing import show

# field -> its neutral values (JSON null always counts as absent; () accepts only null)
NOT_BUILT: dict[str, tuple[Any, ...]] = {
    # sampling: not in this server's sampler
    "use_beam_search": (False,), "length_penalty": (1,), "logits_processors": ([],),
    # structured output
    "guided_decoding_backend": (),
}  # fmt: skip
# vLLM's extras the OpenAI API honours and the native one does not (it always skips special tokens,
# bans no words, scores no prompt, holds no answer to choices, a schema, a pattern, a grammar or a structural tag):
# there they are accepted at these neutral values only
OPENAI_EXTRAS: dict[str, tuple[Any, ...]] = {
    "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,), "bad_words": ([],),
    "prompt_logprobs": (), "guided_choice": (), "guided_json": (), "guided_regex": (),
    "guided_grammar": (), "structural_tag": (), "guided_whitespace_pattern": (),
}  # fmt: skip


def same(value: Any, neutral: Any) -> bool:
    """Equal as JSON values: true is not 1, 0.0 is 0."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    if isinstance(value, (int, float)) and isinstance(neutral, (int, float)):
        return value == neutral
    return type(value) is type(neutral) and bool(value == neutral)


def refusal(name: str, value: Any, neutrals: tuple[Any, ...]) -> str | None:
    """The 400's message when `value` (not null) is none of `neutrals`, else None; `name` as shown."""
    if any(same(value, n) for n in neutrals):
        return None
    accepted = " or ".join(show(n) for n in neutrals) or "only null"
    return f"{name}={show(value, 40)} is not supported by this server (accepted: {accepted})"
