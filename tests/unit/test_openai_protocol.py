"""OpenAI request parsing (frontend.openai.protocol) without a server: values of 0 honoured, defaults,
limits with the vLLM-style context-length message, and refusals naming the parameter."""

import pytest

from spmd_serve.frontend.common.parsing import Limits
from spmd_serve.frontend.openai.protocol import OpenAIError, parse_openai
from tests.support.fakes import BOS, FakeTokenizer

TOK = FakeTokenizer()
LIMITS = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)
NAMES = ("tiny", "default")


def parse(kind="completion", **body):
    body.setdefault("model", "default")
    if kind == "completion":
        body.setdefault("prompt", "hello")
    else:
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return parse_openai(kind, body, TOK, LIMITS, NAMES)


def test_defaults_are_openai_s_not_the_native_ones():
    r = parse()
    p = r.params
    assert (p.temperature, p.top_p, p.top_k, p.min_tokens, p.max_tokens) == (1.0, 1.0, 0, 0, 16)
    assert r.prompts == [[BOS] + TOK.encode("hello")]  # raw text, no chat template
    chat = parse("chat")
    assert chat.params.max_tokens == 50  # min(room, MAX_DEC_LEN)
    assert chat.prompts == [TOK.encode_prompt(messages=[{"role": "user", "content": "hi"}])]


def test_zero_values_are_honoured():
    p = parse(temperature=0, top_p=0, presence_penalty=0, min_tokens=0, top_k=0).params
    assert (p.temperature, p.top_p, p.presence_penalty) == (0.0, 0.0, 0.0) and p.greedy


def test_fields_map_to_sampling_params():
    r = parse(
        "chat",
        max_completion_tokens=7,
        top_k=-1,
        stop="x",
        seed=-5,
        n=3,
        frequency_penalty=1.5,
        repetition_penalty=1.2,
        ignore_eos=True,
        logprobs=True,
        top_logprobs=4,
        min_tokens=2,
        user="u",
    )
    p = r.params
    assert (p.max_tokens, p.top_k, p.stop_sequences, p.min_tokens) == (7, 0, ("x",), 2)
    assert p.seed == (-5) % (1 << 63) and r.n == 3 and r.logprobs == 4 == p.logprobs
    assert (p.frequency_penalty, p.repetition_penalty, p.ignore_eos) == (1.5, 1.2, True)


def test_logit_bias_maps_to_sorted_pairs():
    assert parse(logit_bias={"9": -100, "3": 2.5, "04": 0}).params.logit_bias == ((3, 2.5), (4, 0.0), (9, -100.0))
    assert parse(logit_bias={}).params.logit_bias == ()
    assert parse(allowed_token_ids=[9, 3, 9]).params.allowed_token_ids == (3, 9)


def test_continuous_usage_stats_needs_include_usage():
    on = {"include_usage": True, "continuous_usage_stats": True}
    assert parse(stream=True, stream_options=on).continuous_usage
    assert not parse(stream=True, stream_options={"continuous_usage_stats": True}).continuous_usage


def test_prompt_forms():
    assert len(parse(prompt=["a", "b"]).prompts) == 2
    assert parse(prompt=[5, 6, 7]).prompts == [[5, 6, 7]]
    assert parse(prompt=[[5], [6, 7]]).prompts == [[5], [6, 7]]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "x"}, "model"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 17}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 51}, "max_tokens"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"stop": [1]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"stop": ["END", ""]}, "stop"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [2000000]}, "allowed_token_ids"),
        ({"allowed_token_ids": "5"}, "allowed_token_ids"),
        ({"logit_bias": [1]}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"9" * 5000: 1}}, "logit_bias"),
        ({"logit_bias": {"3": 100.5}}, "logit_bias"),
        ({"logit_bias": {"3": True}}, "logit_bias"),
        ({"logit_bias": {"3": 1, "03": 2}}, "logit_bias"),
        ({"logit_bias": {"2000000": 1}}, "logit_bias"),  # beyond the vocabulary
        ({"logprobs": 21}, "logprobs"),
        ({"min_tokens": 17}, "min_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"max_tokens": 0}, "max_tokens"),  # 0 only with echo
        ({"echo": True, "max_tokens": -1}, "max_tokens"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"best_of": 2}, "best_of"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"temperature": "hot"}, "temperature"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_refusals_name_the_parameter(body, param):
    with pytest.raises(OpenAIError) as e:
        parse(**body)
    assert e.value.param == param and e.value.status in (400, 404)


def test_chat_specific_refusals():
    for body, param in (
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"echo": 1}, "echo"),
        ({"echo": True, "max_tokens": 0}, "max_tokens"),  # (completions' echo alone scores a prompt)
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ):
        with pytest.raises(OpenAIError) as e:
            parse("chat", **body)
        assert e.value.param == param


def test_context_length_message_is_vllm_s():
    with pytest.raises(OpenAIError) as e:
        parse(prompt=[5] * 90, max_tokens=40)
    assert e.value.msg.startswith(
        "This model's maximum context length is 120 tokens. However, "
        "you requested 130 tokens (90 in the messages, 40 in the "
        "completion)."
    )
    with pytest.raises(OpenAIError) as e:
        parse(prompt=[5] * 101)
    assert "MAX_SEQ_LEN" in e.value.msg and "101" in e.value.msg


def test_echo_with_logprobs_scores_the_prompt_and_max_tokens_0_echoes_it_alone():
    """vLLM's (and lm-evaluation-harness's) prompt scoring: echo with logprobs asks the engine for the
    prompt's logprobs too; max_tokens 0 with echo is the prompt alone (the engine makes one token,
    which the answer leaves out)."""
    r = parse(echo=True, logprobs=3, max_tokens=5)
    assert (r.params.prompt_logprobs, r.params.logprobs, r.params.max_tokens, r.echo_only) == (3, 3, 5, False)
    r = parse(echo=True, logprobs=0, max_tokens=0)
    assert (r.params.prompt_logprobs, r.params.max_tokens, r.echo_only) == (0, 1, True)
    r = parse(echo=True, max_tokens=0)
    assert (r.params.prompt_logprobs, r.params.max_tokens, r.echo_only) == (None, 1, True)
    assert parse(logprobs=2).params.prompt_logprobs is None
