"""Every number a request carries is bounded where it is parsed by what the engine holds it in
(int64 seeds, int32 counts / top-k / eos ids, float32 temperatures and penalties, the vocabulary
for token ids), in the native, OpenAI and gRPC parsers and again in SamplingParams.validate: a
refusal is a 400 naming the field, never an overflow inside the engine (issue 17 item 0)."""

from __future__ import annotations

import json

import pytest

from spmd_serve.engine.sampler import sample_arrays
from spmd_serve.frontend.common.parsing import Limits, ProtocolError, decode_body, show
from spmd_serve.frontend.native.protocol import encode_prompt, parse_native_request, sampling_params
from spmd_serve.frontend.openai.protocol import OpenAIError, parse_openai
from spmd_serve.frontend.triton import codec
from spmd_serve.sampling_params import FLOAT32_MAX, INT32_MAX, INT64_MAX, SamplingParams
from spmd_serve.scheduler.request import Request
from tests.support.fakes import FakeTokenizer
from tests.support.triton_helpers import client_request

TOK = FakeTokenizer()
LIMITS = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)


def native(body: dict) -> SamplingParams:
    req = parse_native_request(body)
    return sampling_params(req, len(encode_prompt(req, TOK)), LIMITS)


def openai(**body) -> SamplingParams:
    return parse_openai("completion", {"model": "m", "prompt": "hi", **body}, TOK, LIMITS, ("m",)).params


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("eos_token_ids", [2**64], "eos_token_ids"),  # the body that once killed every rank
        ("eos_token_ids", [INT32_MAX + 1], "eos_token_ids"),
        ("eos_token_ids", [TOK.vocab_size], "outside the vocabulary"),  # like an input_ids one
        ("seed", INT64_MAX + 1, "seed"),
        ("infer_seed", 2**200, "seed"),
        ("temperature", 1e39, "temperature"),
        ("top_p", 1e300, "topp"),
        ("penalty_score", 3.5e38, "penalty_score"),
        ("frequency_score", -1e300, "frequency_score"),
        ("presence_score", 1e308, "presence_score"),
        ("min_dec_len", 2**70, "min_dec_len"),
        ("max_dec_len", 2**63, "max_dec_len"),
    ],
)
def test_native_refuses_what_the_engine_cannot_hold(field, value, named):
    with pytest.raises(ProtocolError) as e:
        native({"text": "hi", field: value})
    assert e.value.status == 400 and named in e.value.msg


def test_native_edges_that_fit_are_accepted():
    p = native({"text": "hi", "seed": INT64_MAX, "eos_token_ids": [TOK.vocab_size - 1], "temperature": FLOAT32_MAX})
    assert p.seed == INT64_MAX
    assert sample_arrays([Request("r", [5], p, eos_token_ids=frozenset(p.eos_token_ids))])["seeds"][0] == INT64_MAX


@pytest.mark.parametrize(
    "field, value",
    [
        ("top_k", INT32_MAX + 1),
        ("seed", INT64_MAX + 1),
        ("seed", -(2**63) - 1),
        ("temperature", 1e39),
        ("repetition_penalty", 1e300),
        ("max_tokens", 2**64),
        ("min_tokens", 2**64),
    ],
)
def test_openai_refuses_what_the_engine_cannot_hold(field, value):
    with pytest.raises(OpenAIError) as e:
        openai(**{field: value})
    assert (e.value.status, e.value.param) == (400, field)


def test_openai_int64_seeds_all_fit():
    assert openai(seed=-(2**63)).seed == 0 and openai(seed=INT64_MAX).seed == INT64_MAX


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(eos_token_ids=(2**64,)),
        SamplingParams(seed=2**64),
        SamplingParams(top_k=2**31),
        SamplingParams(temperature=float("nan")),
        SamplingParams(max_tokens=2**31),
        SamplingParams(frequency_penalty=float("inf")),
    ],
)
def test_validate_is_the_engine_s_own_bound(params):
    """What a parser let through by mistake is still refused at admission (Engine._admit)."""
    with pytest.raises(ValueError):
        params.validate()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("raw", [nested(100_000), b'{"text": "\\ud800"}', b'{"a": NaN}', b"\xff", b"[1, 2"])
def test_grpc_in_tensor_is_decoded_as_strictly_as_an_http_body(raw):
    with pytest.raises(ProtocolError) as e:
        codec.read_in(client_request(raw))
    assert e.value.status == 400 and "input IN" in e.value.msg
    with pytest.raises(ProtocolError):
        decode_body(raw)


def test_deep_values_are_quoted_without_overflowing():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert show(deep) == "a list"
    assert json.loads(show([1, "é"])) == [1, "é"]
