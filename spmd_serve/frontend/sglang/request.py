"""An SGLang `/generate` body as the completions request it asks for: `text` or `input_ids` (one
prompt or a batch), `sampling_params` (SGLang's names: max_new_tokens, min_new_tokens, stop,
stop_token_ids, temperature, top_p, top_k, min_p, the penalties, ignore_eos, skip_special_tokens,
spaces_between_special_tokens, no_stop_trim, n, json_schema, regex, ebnf, structural_tag,
logit_bias, sampling_seed), `stream`, `return_logprob` with `top_logprobs_num` and
`return_text_in_logprobs`, the prompt's logprobs from `logprob_start_len` (the completions request's
vLLM `prompt_logprobs`), and `rid`.  The completions parser (openai.protocol) then checks it all
and `rename` gives its refusals SGLang's names.  What SGLang has and this server does not build
(images, LoRA, hidden states) is refused by name, at any value but the one that changes nothing.
Pure data: no tornado, no engine.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from spmd_serve.frontend.common.parsing import show
from spmd_serve.frontend.openai.body import OpenAIError, get
from spmd_serve.sampling_params import INT32_MAX, MAX_LOGPROBS

FIELDS = {"text", "input_ids", "sampling_params", "stream", "return_logprob", "top_logprobs_num"} | {
    "return_text_in_logprobs", "rid", "logprob_start_len", "model",
}  # fmt: skip
NEUTRAL: dict[str, tuple[Any, ...]] = {  # SGLang's other fields: only where they change nothing
    "image_data": (), "audio_data": (), "video_data": (), "input_embeds": (), "lora_path": (), "lora_id": (),
    "return_hidden_states": (False,), "custom_logit_processor": (), "log_metrics": (True,), "modalities": (),
    "session_params": (), "token_ids_logprob": (), "data_parallel_rank": (), "bootstrap_host": (),
    "bootstrap_port": (), "bootstrap_room": (),
}  # fmt: skip
# SGLang's sampling parameter -> the completions field it is (absent: the same name)
SAMPLING = {
    "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "no_stop_trim": "include_stop_str_in_output",
    "json_schema": "guided_json", "regex": "guided_regex", "ebnf": "guided_grammar", "sampling_seed": "seed",
    **{k: k for k in ("stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                      "presence_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens",
                      "spaces_between_special_tokens", "n", "structural_tag", "logit_bias")},
}  # fmt: skip
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's


@dataclass
class GenerateRequest:
    completion: dict[str, Any]  # the completions body it asks for
    stream: bool = False
    batch: bool = False  # a list of prompts (or n > 1): the answer is a list, one object per output
    rids: list[str] = field(default_factory=list)  # the id of each prompt's outputs ("" = a fresh one)
    logprobs: bool = False  # return_logprob: output_token_logprobs (and output_top_logprobs)
    text_in_logprobs: bool = False  # ... with each token's text
    input_from: int = -1  # logprob_start_len: input_token_logprobs from this prompt position (-1: none)
    top: int = 0  # top_logprobs_num: each position's most likely tokens
    prompt_field: str = "text"  # "input_ids" where the prompt came as ids (the name a refusal gives it)

    def output_ids(self) -> list[str]:
        """Every output's id, the engine's too (what /abort_request names): its prompt's rid, or
        `<rid>_<i>` for n > 1 (SGLang's), or a fresh uuid where none was given."""
        n = self.completion.get("n", 1)
        n = n if isinstance(n, int) and n >= 1 else 1  # (a bad n is refused before an id is used)
        if n == 1:
            return [rid or uuid.uuid4().hex for rid in self.rids]
        return [f"{rid}_{i}" if rid else uuid.uuid4().hex for rid in self.rids for i in range(n)]


def parse(body: dict[str, Any], model: str, max_dec_len: int) -> GenerateRequest:
    """The completions request a /generate body asks for (`max_dec_len`: MAX_DEC_LEN, which bounds
    SGLang's default max_new_tokens where none is asked)."""
    unknown = next((k for k, v in body.items() if v is not None and k not in FIELDS | set(NEUTRAL)), None)
    if unknown is not None:
        raise OpenAIError(400, f"{unknown}: not a field of /generate", unknown)
    for key, neutral in NEUTRAL.items():
        if body.get(key) is not None and body[key] not in neutral:
            raise OpenAIError(400, f"{key}: not supported by this server (it serves text models)", key)
    if (body.get("text") is None) == (body.get("input_ids") is None):
        raise OpenAIError(400, "give either text or input_ids (not both)", "text")
    prompt, batch = _prompt(body)
    completion = {"model": body.get("model") or model, "prompt": prompt, **_sampling(body.get("sampling_params"))}
    completion.setdefault("max_tokens", min(DEFAULT_MAX_NEW_TOKENS, max_dec_len))
    stream = get(body, "stream", "bool", False)
    completion.update(stream=stream, return_token_ids=True)
    start = get(body, "logprob_start_len", "int", -1, -1, INT32_MAX)
    logprobs = get(body, "return_logprob", "bool", False)
    top = get(body, "top_logprobs_num", "int", 0, 0, MAX_LOGPROBS)
    if logprobs:
        completion["logprobs"] = top
    if logprobs and start >= 0:  # (SGLang's meta_info has their place in a stream too: it is this handler's)
        completion.update(prompt_logprobs=top, stream=False)
    prompts = len(prompt) if batch else 1
    rids = _rids(body.get("rid"), prompts)
    n = completion.get("n", 1)
    field = "text" if body.get("text") is not None else "input_ids"
    return GenerateRequest(completion, stream, batch or n != 1, rids, logprobs,
                           get(body, "return_text_in_logprobs", "bool", False), prompt_field=field,
                           input_from=start if logprobs else -1, top=top)  # fmt: skip


def _prompt(body: dict[str, Any]) -> tuple[Any, bool]:
    """The prompt (a text, token ids, or a list of either: a batch) and whether it is a batch."""
    if body.get("text") is not None:
        text = body["text"]
        if isinstance(text, str) or (isinstance(text, list) and text and all(isinstance(t, str) for t in text)):
            return text, isinstance(text, list)
        raise OpenAIError(400, f"text must be a string or a non-empty list of strings, got {show(text)}", "text")
    ids = body["input_ids"]
    if isinstance(ids, list) and ids and all(isinstance(i, list) for i in ids):
        return ids, True  # (each list's ids are checked by the completions parser)
    if isinstance(ids, list) and ids and not any(isinstance(i, (list, str)) for i in ids):
        return ids, False
    raise OpenAIError(400, f"input_ids must be a list of token ids or a list of such lists, got {show(ids)}",
                      "input_ids")  # fmt: skip


def _sampling(params: Any) -> dict[str, Any]:
    """sampling_params as completions fields (a batch's list: one for every prompt, so all alike)."""
    if isinstance(params, list) and params and all(p == params[0] for p in params):
        params = params[0]
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise OpenAIError(400, f"sampling_params must be an object (one for every prompt), got {show(params)}",
                          "sampling_params")  # fmt: skip
    out = {}
    for key, value in params.items():
        if value is None:
            continue
        if key not in SAMPLING:
            raise OpenAIError(400, f"sampling_params.{key}: not supported by this server", f"sampling_params.{key}")
        out[SAMPLING[key]] = value
    return out


def _rids(rid: Any, prompts: int) -> list[str]:
    if rid is None:
        return [""] * prompts
    rids = [rid] if isinstance(rid, str) and prompts == 1 else rid
    if not (isinstance(rids, list) and len(rids) == prompts and all(isinstance(r, str) and r for r in rids)):
        raise OpenAIError(400, f"rid must be a non-empty string for each of the {prompts} prompt(s)", "rid")
    if len(set(rids)) != len(rids):  # (each names its request, to /abort_request too)
        raise OpenAIError(400, "rid: each prompt's rid must be different", "rid")
    return rids


_NAMES = {v: f"sampling_params.{k}" for k, v in SAMPLING.items()} | {"logprobs": "top_logprobs_num"}


def rename(msg: str, param: str | None, prompt_field: str = "text") -> tuple[str, str | None]:
    """A completions refusal in /generate's names (max_tokens -> sampling_params.max_new_tokens; the
    prompt -> `prompt_field`)."""
    names = {**_NAMES, "prompt": prompt_field}
    pattern = r"\b(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")\b"
    renamed = re.sub(pattern, lambda m: names[m.group(1)], msg)
    return renamed, None if param is None else names.get(param, param)
