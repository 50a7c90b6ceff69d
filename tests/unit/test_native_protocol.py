"""Native request parsing, limits and the stop-string assembler, without a server."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from spmd_serve.frontend.common.http_base import bearer_ok
from spmd_serve.frontend.common.parsing import Limits, ProtocolError, decode_body
from spmd_serve.frontend.native.protocol import encode_prompt, final_fields, parse_native_request, sampling_params
from spmd_serve.frontend.text.output_assembler import OutputAssembler
from tests.support.fakes import BOS, FakeTokenizer

LIMITS = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)


def params(body: dict, input_len: int = 10, limits: Limits = LIMITS):
    return sampling_params(parse_native_request(body), input_len, limits)


def test_defaults_match_the_contract():
    req = parse_native_request({"text": "hi"})
    assert uuid.UUID(req.req_id)  # a fresh uuid
    assert (req.min_dec_len, req.topp, req.temperature, req.penalty_score) == (1, 0.7, 0.95, 1.0)
    assert (req.frequency_score, req.presence_score, req.seed) == (0.0, 0.0, None)
    assert (req.stream, req.timeout, req.return_usage) == (False, 300.0, False)
    p = params({"text": "hi"}, input_len=10)
    assert p.max_tokens == 50  # min(120 - 10, 50)
    assert params({"text": "hi"}, input_len=90).max_tokens == 30  # min(120 - 90, 50)
    assert (p.min_tokens, p.top_p, p.temperature, p.repetition_penalty) == (1, 0.7, 0.95, 1.0)


@pytest.mark.parametrize("alias", ["seq_len", "max_tokens"])
def test_aliases(alias):
    p = params({"text": "a", alias: 7, "top_p": 0.3, "infer_seed": 5})
    assert (p.max_tokens, p.top_p, p.seed) == (7, 0.3, 5)
    p = params({"text": "a", "max_dec_len": 9, alias: 7, "topp": 0.1, "top_p": 0.3})
    assert (p.max_tokens, p.top_p) == (9, 0.1)  # canonical name wins


def test_the_openai_names_of_native_settings_act():
    # a body without "model" is native (CONTRACT §3): OpenAI names of the same settings must not vanish
    p = params(
        {
            "text": "a",
            "max_completion_tokens": 6,
            "min_tokens": 3,
            "repetition_penalty": 1.2,
            "frequency_penalty": 0.4,
            "presence_penalty": -0.3,
            "stop": "END",
        }
    )
    assert (p.max_tokens, p.min_tokens, p.repetition_penalty) == (6, 3, 1.2)
    assert (p.frequency_penalty, p.presence_penalty, p.stop_sequences) == (0.4, -0.3, ("END",))
    # the native name wins over its alias, as for the original aliases
    p = params({"text": "a", "stop_sequences": ["x"], "stop": ["y"], "penalty_score": 1.1, "repetition_penalty": 2})
    assert (p.stop_sequences, p.repetition_penalty) == (("x",), 1.1)
    with pytest.raises(ProtocolError, match=r"^stop must be a list of non-empty strings"):
        parse_native_request({"text": "a", "stop": ["ok", ""]})
    with pytest.raises(ProtocolError, match=r"^min_tokens must be an integer"):
        parse_native_request({"text": "a", "min_tokens": 1.5})


@pytest.mark.parametrize("field,value", [("top_k", 5), ("n", 1), ("logprobs", True), ("logit_bias", {"1": 5})])
def test_openai_only_fields_are_refused_by_name(field, value):
    want = f'{field}: not a field of the native API; the OpenAI HTTP API takes it (a body with "model")'
    with pytest.raises(ProtocolError) as e:
        parse_native_request({"text": "a", "req_id": "r", field: value})
    assert (e.value.status, e.value.req_id, e.value.msg) == (400, "r", want)
    with pytest.raises(ProtocolError, match=r"^n, top_k: not fields of the native API; the OpenAI HTTP API takes them"):
        parse_native_request({"text": "a", "top_k": 5, "n": 2})
    assert parse_native_request({"text": "a", field: None}).text == "a"  # null: absent


@pytest.mark.parametrize(
    "field,value,neutral",
    [("bad_words", ["x"], []), ("skip_special_tokens", False, True), ("guided_json", {"type": "object"}, None),
     ("use_beam_search", True, False), ("length_penalty", 0.5, 1)],
)  # fmt: skip
def test_vllms_not_built_extras_act_or_are_refused_by_name(field, value, neutral):
    # vLLM's extras that would change the output: a native body must not drop them silently either
    with pytest.raises(ProtocolError) as e:
        parse_native_request({"text": "a", "req_id": "r", field: value})
    assert (e.value.status, e.value.req_id) == (400, "r")
    assert e.value.msg.startswith(f"{field}=") and "is not supported by this server (accepted: " in e.value.msg
    assert parse_native_request({"text": "a", field: neutral}).text == "a"  # neutral (or null): nothing changes


def test_the_not_built_extras_are_refused_alike_by_both_apis():
    from spmd_serve.frontend.common.vllm_extras import NOT_BUILT
    from spmd_serve.frontend.openai.fields import NEUTRAL, check_fields

    for field, neutrals in NOT_BUILT.items():
        assert all(NEUTRAL[kind][field] == neutrals for kind in NEUTRAL)
        bad = {"x": 1}  # no neutral value is a dict of this shape
        with pytest.raises(ProtocolError) as native_error:
            parse_native_request({"text": "a", field: bad})
        with pytest.raises(ProtocolError) as openai_error:
            check_fields({"model": "m", "prompt": "a", field: bad}, "completion")
        assert native_error.value.msg == openai_error.value.msg


def test_every_field_the_openai_api_honours_is_native_an_alias_or_refused():
    # the two tables live apart (a protocol imports no other): this keeps them from drifting
    from spmd_serve.frontend.common.vllm_extras import OPENAI_EXTRAS
    from spmd_serve.frontend.native import protocol as native
    from spmd_serve.frontend.openai.fields import HONOURED, NEUTRAL

    native_names = {f.name for f in dataclasses.fields(native.NativeRequest)}
    aliases = {a for names in native._ALIASES.values() for a in names}
    not_native = set(HONOURED["completion"] | HONOURED["chat"]) - native_names - aliases
    # model makes a body OpenAI's; user is ignored there too; prompt is the completions endpoint's;
    # the detokenisation extras are taken at their neutral value (always so natively)
    left = {"model", "user", "prompt", "add_special_tokens", *OPENAI_EXTRAS}
    assert not_native - set(native.OPENAI_ONLY) == left
    # and the refused names are the OpenAI API's: honoured there, or known and not implemented
    assert set(native.OPENAI_ONLY) <= not_native | set(NEUTRAL["completion"]) | set(NEUTRAL["chat"])


def test_mapping_to_sampling_params():
    p = params(
        {
            "input_ids": [5, 6],
            "temperature": 0,
            "penalty_score": 1.3,
            "seed": 0,
            "frequency_score": 0.5,
            "presence_score": -0.5,
            "min_dec_len": 2,
            "eos_token_ids": [7, 8],
            "stop_sequences": ["\n\n"],
        }
    )
    assert p.greedy and p.seed == 0 and p.repetition_penalty == 1.3 and p.min_tokens == 2
    assert (p.frequency_penalty, p.presence_penalty) == (0.5, -0.5)
    assert p.eos_token_ids == (7, 8) and p.stop_sequences == ("\n\n",)


def test_nulls_and_unknown_keys_are_ignored():
    req = parse_native_request(
        {"text": "a", "seed": None, "topp": None, "foo": {"bar": 1}, "messages": None, "req_id": 42}
    )
    assert req.seed is None and req.topp == 0.7 and req.req_id == "42"
    assert parse_native_request({"text": "a", "stop_sequences": "END"}).stop_sequences == ("END",)


@pytest.mark.parametrize(
    "body,field",
    [
        ({"text": "a", "max_dec_len": True}, "max_dec_len"),
        ({"text": "a", "temperature": "0.5"}, "temperature"),
        ({"text": "a", "min_dec_len": 1.0}, "min_dec_len"),
        ({"text": "a", "stream": 1}, "stream"),
        ({"text": "a", "timeout": 0}, "timeout"),
        ({"text": "a", "req_id": ""}, "req_id"),
        ({"messages": [{"role": "user"}]}, "messages"),
        ({"messages": []}, "messages"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [True]}, "input_ids"),
        ({"input_ids": [-1]}, "input_ids"),
        ({"text": "a", "eos_token_ids": [1.0]}, "eos_token_ids"),
        ({"text": "a", "stop_sequences": ["END", ""]}, "stop_sequences"),  # "" would stop at once
    ],
)
def test_type_errors_name_the_field(body, field):
    with pytest.raises(ProtocolError) as e:
        parse_native_request(body)
    assert e.value.status == 400 and field in e.value.msg


@pytest.mark.parametrize(
    "body,field",
    [
        ({"text": "a", "max_dec_len": 0}, "max_dec_len"),
        ({"text": "a", "topp": -0.1}, "topp"),
        ({"text": "a", "temperature": -1}, "temperature"),
        ({"text": "a", "seed": -3}, "seed"),
        ({"text": "a", "penalty_score": 0}, "penalty_score"),
        ({"text": "a", "min_dec_len": 20, "max_dec_len": 10}, "min_dec_len"),
    ],
)
def test_range_errors_name_the_field(body, field):
    with pytest.raises(ProtocolError) as e:
        params(body)
    assert e.value.status == 400 and field in e.value.msg


def test_length_limits_exact_messages():
    with pytest.raises(
        ProtocolError,
        match=r"^Length of input token\(101\) exceeds the limit "
        r"MAX_SEQ_LEN\(100\)\.$",
    ):
        params({"text": "a"}, input_len=101)
    with pytest.raises(
        ProtocolError,
        match=r"^The parameter max_dec_len\(51\) exceeds the "
        r"limit MAX_DEC_LEN\(50\)\.$",
    ):
        params({"text": "a", "max_dec_len": 51})
    with pytest.raises(ProtocolError, match="max length"):
        params({"text": "a"}, input_len=120, limits=Limits(200, 50, 120))
    # asked for more than the model has room for: generation stops at the model's length
    assert params({"text": "a", "max_dec_len": 50}, input_len=100).max_tokens == 20


@pytest.mark.parametrize("raw", [b"{", b"[]", b'"x"', b"\xc3", b"", b'{"a": Infinity}'])
def test_decode_body_never_raises_anything_but_400(raw):
    with pytest.raises(ProtocolError) as e:
        decode_body(raw)
    assert e.value.status == 400


def test_encode_prompt_uses_template_and_reports_bad_messages():
    tok = FakeTokenizer()
    req = parse_native_request({"text": "hi", "system": "S"})
    assert encode_prompt(req, tok) == [BOS] + tok.encode("<system>S\n<user>hi\n<assistant>")
    assert encode_prompt(parse_native_request({"input_ids": [9, 8]}), tok) == [9, 8]
    with pytest.raises(ProtocolError, match="messages"):
        encode_prompt(parse_native_request({"messages": [{"role": "bot", "content": "x"}]}), tok)


class _CharDetok:
    def step(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def flush(self) -> str:
        return ""


def feed(text: str, stops: tuple[str, ...], finish_at_end: bool = True) -> tuple[list[str], OutputAssembler]:
    asm = OutputAssembler(_CharDetok(), stops)
    deltas = [asm.add([ord(c)], finish_at_end and k == len(text) - 1) for k, c in enumerate(text)]
    return deltas, asm


def test_assembler_holds_back_a_possible_stop_prefix():
    deltas, asm = feed("abcSTOPxyz", ("STOP",), finish_at_end=False)
    assert asm.stopped and asm.text == "abc" and "".join(deltas) == "abc"
    assert deltas[:4] == ["", "", "", "a"]  # 3 chars held back


def test_assembler_earliest_stop_wins_and_no_stop_passes_through():
    deltas, asm = feed("one two three", ("three", "two"))
    assert asm.text == "one " and "".join(deltas) == "one "
    deltas, asm = feed("no stops here", ("zz",))
    assert not asm.stopped and "".join(deltas) == "no stops here" == asm.text
    deltas, asm = feed("plain", ())
    assert deltas == list("plain")  # no holding back at all


def test_final_fields_and_bearer():
    f = final_fields("ab", [1, 2], "length", 5, True, 4)
    assert f["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "cached_tokens": 4}
    assert "usage" not in final_fields("ab", [1, 2], "stop", 5, False)
    assert bearer_ok(None, None) and bearer_ok("Bearer k", "k") and bearer_ok("bearer  k", "k")
    assert not bearer_ok(None, "k") and not bearer_ok("Bearer x", "k") and not bearer_ok("k", "k")
