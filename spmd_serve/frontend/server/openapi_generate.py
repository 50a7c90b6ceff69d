"""The JSON schemas of `POST /generate` (SGLang's native API) in the OpenAPI document: the request,
as sglang.request reads it (its sampling parameters share the completions request's schemas under
SGLang's names), and the output object, whole or streamed.
"""

from __future__ import annotations

from spmd_serve.frontend.server.openapi_schemas import BOOL, NULL_IS_ABSENT, STR, Schema, _int, _list, _obj, _only, _opt
from spmd_serve.frontend.server.settings import IOSettings
from spmd_serve.frontend.sglang.request import NEUTRAL, SAMPLING
from spmd_serve.sampling_params import INT32_MAX, MAX_LOGPROBS


# fmt: off
def generate_schemas(s: IOSettings, completion_request: Schema) -> dict[str, Schema]:
    """`completion_request`: the CompletionRequest schema, whose fields the sampling parameters share."""
    fields = completion_request["properties"]
    sampling = {ours: fields[theirs] for ours, theirs in SAMPLING.items()}
    sampling["max_new_tokens"] = _opt(_int(1, s.limits.max_dec_len, default=128))
    sampling["no_stop_trim"] = _opt(BOOL | {"description": "the stop string stays in the text"})
    sampling["ebnf"] = _opt(STR | {"description": "a GBNF (or Lark) grammar the answer is held to"})
    sampling["json_schema"] = _opt(STR | {"description": "a JSON schema's text the answer is held to"})
    ids = _list(_int(0), minItems=1)
    request = _obj([], {
        "text": _opt({"anyOf": [STR, _list(STR, minItems=1)]}),
        "input_ids": _opt({"anyOf": [ids, _list(ids, minItems=1)]}),
        "sampling_params": _opt(_obj([], sampling, additionalProperties=False,
                                     description="one for every prompt (a batch's list: all alike)")),
        "stream": _opt(BOOL), "return_logprob": _opt(BOOL), "return_text_in_logprobs": _opt(BOOL),
        "top_logprobs_num": _opt(_int(0, MAX_LOGPROBS)), "logprob_start_len": _opt(_int(
            -1, INT32_MAX, description="with return_logprob: input_token_logprobs from this position (-1: none)")),
        "rid": _opt({"anyOf": [STR, _list(STR)]}), "model": _opt({"enum": list(s.model_names)}),
        **{k: _only(v) for k, v in NEUTRAL.items()},
    }, description="Exactly one of text, input_ids; any other field is refused with 400 naming it. "
       + NULL_IS_ABSENT, additionalProperties=False)
    finish = {"anyOf": [_obj(["type", "matched"], {"type": {"const": "stop"}, "matched": {"type": [
        "string", "integer"]}}), _obj(["type", "length"], {"type": {"const": "length"}, "length": _int(1)}),
        _obj(["type", "message"], {"type": {"const": "abort"}, "message": STR}), {"type": "null"}]}
    meta = _obj(["id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"], {
        "id": STR, "finish_reason": finish, **{k: _int(0) for k in ("prompt_tokens", "completion_tokens",
                                                                    "cached_tokens")},
        "e2e_latency": {"type": "number"}, "output_token_logprobs": _list(_list({})),
        "output_top_logprobs": _list(_list(_list({}))), "input_token_logprobs": _list(_list({})),
        "input_top_logprobs": _list({"anyOf": [{"type": "null"}, _list(_list({}))]})},
        description="with return_logprob: output_token_logprobs [logprob, token id, text or null] per token")
    output = _obj(["text", "output_ids", "meta_info"], {"text": STR, "output_ids": _list(_int(0)),
                                                        "meta_info": meta, "index": _int(0)})
    info = _obj(["model_path", "is_generation"], {"model_path": STR, "tokenizer_path": STR, "is_generation": BOOL,
                                                  "preferred_sampling_params": {"type": "null"}, "weight_version": STR,
                                                  "has_image_understanding": BOOL, "has_audio_understanding": BOOL})
    abort = _obj([], {"rid": _opt(STR), "abort_all": _opt(BOOL)}, additionalProperties=False,
                 description="rid: the request's (a /generate rid, a native req_id); or abort_all: true")
    return {"GenerateRequest": request, "GenerateOutput": output, "ModelInfo": info, "AbortRequest": abort,
            "Aborted": _obj(["aborted"], {"aborted": _list(STR)}),
            "GenerateAnswer": {"anyOf": [output, _list(output)], "description": "a list for a batch or n > 1"}}
# fmt: on
