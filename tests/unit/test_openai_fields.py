"""No OpenAI field is silently ignored (CONTRACT.md §4, issue 17 item 4): every field vLLM's
completion and chat requests define is honoured or refused by name, an unknown one is refused with
OpenAI's wording, and the vLLM extras we honour act: stop_token_ids (stop, even with ignore_eos;
their text left out unless include_stop_str_in_output), include_stop_str_in_output for stop
strings, truncate_prompt_tokens, bad_words, guided_choice."""

from __future__ import annotations

import pytest

from spmd_serve.engine.sampler import sample_arrays
from spmd_serve.frontend.common.parsing import Limits
from spmd_serve.frontend.openai.fields import HONOURED, NEUTRAL
from spmd_serve.frontend.openai.protocol import OpenAIError, parse_openai
from spmd_serve.frontend.text.output_assembler import OutputAssembler
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from tests.support.fakes import FakeDetokenizer, FakeTokenizer
from tests.support.scheduler_harness import make_scheduler, run

TOK = FakeTokenizer()
LIMITS = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)

# The request fields of vLLM's CompletionRequest and ChatCompletionRequest (vllm/entrypoints/openai/
# protocol.py, 2025) and OpenAI's own; each must be honoured or have a neutral value we accept.
VLLM_COMMON = """model max_tokens temperature top_p n stream stream_options presence_penalty frequency_penalty
logit_bias logprobs seed stop user best_of use_beam_search top_k min_p repetition_penalty length_penalty
stop_token_ids include_stop_str_in_output ignore_eos min_tokens skip_special_tokens
spaces_between_special_tokens truncate_prompt_tokens allowed_token_ids prompt_logprobs add_special_tokens
response_format guided_json guided_regex guided_choice guided_grammar guided_decoding_backend
guided_whitespace_pattern structural_tag priority request_id logits_processors return_tokens_as_token_ids
cache_salt kv_transfer_params vllm_xargs""".split()
VLLM_FIELDS = {
    "completion": VLLM_COMMON + ["prompt", "echo", "suffix"],
    "chat": VLLM_COMMON
    + """messages max_completion_tokens top_logprobs tools tool_choice parallel_tool_calls reasoning_effort
    bad_words echo add_generation_prompt continue_final_message documents chat_template chat_template_kwargs
    mm_processor_kwargs functions function_call store metadata service_tier modalities audio prediction
    web_search_options""".split(),
}


def parse(kind="completion", **body):
    body.setdefault("model", "m")
    body.setdefault("prompt" if kind == "completion" else "messages", "hello" if kind == "completion" else [
        {"role": "user", "content": "hi"}
    ])  # fmt: skip
    return parse_openai(kind, body, TOK, LIMITS, ("m",))


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_every_vllm_field_is_honoured_or_has_a_refusal(kind):
    known = HONOURED[kind] | set(NEUTRAL[kind])
    assert set(VLLM_FIELDS[kind]) - known == set()


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_unknown_fields_are_refused_with_openai_s_wording(kind):
    with pytest.raises(OpenAIError) as e:
        parse(kind, temprature=0.5)
    assert (e.value.status, e.value.param) == (400, "temprature")
    assert e.value.msg == "Unrecognized request argument supplied: temprature"
    with pytest.raises(OpenAIError) as e:
        parse(kind, stream=True, stream_options={"include_usage": True, "every_chunk": True})
    assert e.value.param == "stream_options.every_chunk"


@pytest.mark.parametrize(
    "kind, field, neutral, other",
    [
        ("completion", "logits_processors", [], ["x"]),
        ("chat", "length_penalty", 1, 0.5),
        ("completion", "use_beam_search", False, True),
        ("chat", "response_format", {"type": "text"}, {"type": "yaml"}),
        ("completion", "tools", [], [{"type": "function", "function": {"name": "f"}}]),
        ("completion", "tool_choice", "none", "required"),
        ("chat", "add_special_tokens", False, True),
        ("completion", "suffix", "", "!"),
        ("completion", "priority", 0, 1),
        ("chat", "guided_decoding_backend", None, "xgrammar"),
        ("chat", "store", False, True),
    ],
)
def test_known_unsupported_fields_are_refused_by_name_unless_neutral(kind, field, neutral, other):
    parse(kind, **{field: neutral})  # changes nothing: accepted
    with pytest.raises(OpenAIError) as e:
        parse(kind, **{field: other})
    assert (e.value.status, e.value.param) == (400, field) and field in e.value.msg


def test_neutral_means_the_same_json_value():
    with pytest.raises(OpenAIError):
        parse(use_beam_search=0)  # 0 is not false
    with pytest.raises(OpenAIError):
        parse(min_p=False)  # false is not 0


def test_stop_token_ids_reach_the_params_and_are_checked_against_the_vocabulary():
    p = parse(stop_token_ids=[70, 71], include_stop_str_in_output=True).params
    assert (p.stop_token_ids, p.include_stop_str_in_output) == ((70, 71), True)
    for bad in ([TOK.vocab_size], [-1], 5, [2**64]):
        with pytest.raises(OpenAIError) as e:
            parse(stop_token_ids=bad)
        assert e.value.param == "stop_token_ids"


def test_bad_words_become_token_sequences_as_vllm_makes_them(tmp_path):
    """Each word's ids (leading spaces stripped, repeats dropped), and with a tokenizer that has a
    word-initial piece (byte-level BPE: "cat" and "Ġcat") its ids after a space too."""
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer
    from tests.support.hf_tokenizer_dirs import write_byte_level_dir

    p = parse(bad_words=["ab", "  ab", "c"]).params  # char-level: " ab" is one id longer, not a variant
    assert p.bad_words == (tuple(TOK.encode("ab")), tuple(TOK.encode("c")))
    qwen = ServingTokenizer.from_model_dir(write_byte_level_dir(tmp_path / "q", "qwen2"), use_hf_tokenizer=True)
    words = parse_openai("completion", {"model": "m", "prompt": "x", "bad_words": ["cat"]}, qwen, LIMITS, ("m",))
    assert words.params.bad_words == (tuple(qwen.encode("cat")), tuple(qwen.encode(" cat")))
    spaced, plain = qwen.encode(" cat"), qwen.encode("cat")
    assert len(spaced) == len(plain) and spaced[0] != plain[0]  # ("Ġcat"-style: the case the rule is for)
    for bad, says in [
        ("ab", "a list of non-blank strings"), ([""], "non-blank"), (["a", " "], "non-blank"), ([3], "strings"),
        (["x" * 65], "more than 64 tokens"), ([chr(97 + i % 26) * (1 + i // 26) for i in range(129)], "at most 128"),
    ]:  # fmt: skip
        with pytest.raises(OpenAIError) as e:
            parse(bad_words=bad)
        assert (e.value.param, says in e.value.msg) == ("bad_words", True), e.value.msg
    with pytest.raises(OpenAIError, match="ban every token allowed_token_ids allows"):
        parse(bad_words=["a", "b"], allowed_token_ids=TOK.encode("ba"))
    assert parse(bad_words=["a", "cb"], allowed_token_ids=TOK.encode("ba")).params.allowed_token_ids


def test_guided_choice_becomes_token_sequences_that_read_back_as_the_answers():
    p = parse("chat", guided_choice=["yes", "no", "yes"]).params
    assert p.guided_sequences == (tuple(TOK.encode("yes")), tuple(TOK.encode("no")))
    for body, says in [
        ({"guided_choice": "yes"}, "1 to 64 non-empty strings"), ({"guided_choice": []}, "1 to 64"),
        ({"guided_choice": ["a", ""]}, "non-empty"), ({"guided_choice": ["a"] * 65}, "1 to 64"),
        ({"guided_choice": ["a"], "ignore_eos": True}, "not with ignore_eos or min_tokens"),
        ({"guided_choice": ["a"], "min_tokens": 1}, "not with ignore_eos or min_tokens"),
        ({"guided_choice": ["x" * 257]}, "more than 256 tokens"),
    ]:  # fmt: skip
        with pytest.raises(OpenAIError) as e:
            parse("chat", **body)
        assert (e.value.param, says in e.value.msg) == ("guided_choice", True), e.value.msg


def test_structured_outputs_choice_is_guided_choice():
    """Later vLLM's structured_outputs: its choice is guided_choice; what is not built is refused by name."""
    p = parse("chat", structured_outputs={"choice": ["yes", "no"], "disable_fallback": False}).params
    assert p.guided_sequences == parse("chat", guided_choice=["yes", "no"]).params.guided_sequences
    for body, param in [
        ({"structured_outputs": {"grammar": "a+"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"choice": ["a"]}, "guided_choice": ["a"]}, "structured_outputs"),
        ({"structured_outputs": ["a"]}, "structured_outputs"),
        ({"structured_outputs": {"choice": "a"}}, "structured_outputs.choice"),
    ]:
        with pytest.raises(OpenAIError) as e:
            parse("chat", **body)
        assert e.value.param == param, e.value.msg


def test_a_choice_whose_tokens_read_otherwise_is_refused(demo_checkpoint):
    """SentencePiece writes a word's first piece with its space: as a completion's continuation
    "▁yes" reads " yes", so the answer could never be "yes" itself (a chat answer starts afresh);
    " yes" is those tokens."""
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    tok = ServingTokenizer.from_model_dir(demo_checkpoint)
    body = {"model": "m", "prompt": "Answer:", "guided_choice": ["yes"]}
    with pytest.raises(OpenAIError, match='tokens for "yes" read " yes" after the prompt, not the answer itself'):
        parse_openai("completion", body, tok, LIMITS, ("m",))
    spaced = parse_openai("completion", {**body, "guided_choice": [" yes"]}, tok, LIMITS, ("m",))
    assert spaced.params.guided_sequences == (tuple(tok.encode("yes")),)  # the word marker writes the space
    chat = {"model": "m", "messages": [{"role": "user", "content": "?"}], "guided_choice": ["yes"]}
    assert parse_openai("chat", chat, tok, LIMITS, ("m",)).params.guided_sequences == (tuple(tok.encode("yes")),)


def test_a_token_prompt_s_echo_writes_its_special_tokens(demo_checkpoint):
    """vLLM's echo of a prompt of token ids is the tokenizer's decode, special tokens written (as
    HF's decode writes them): a BOS the client sent shows; a text prompt echoes as it was sent."""
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    tok = ServingTokenizer.from_model_dir(demo_checkpoint)
    ids = [tok.bos_token_id, *tok.encode("Hello there")]
    body = {"model": "m", "prompt": ids, "echo": True, "max_tokens": 1}
    got = parse_openai("completion", body, tok, LIMITS, ("m",)).prompt_texts[0]
    assert got == tok.decode(ids, skip_special_tokens=False)  # (a space after it: this tokenizer's decode)
    assert got.startswith(tok.special_text(ids[0])) and got.endswith(tok.decode(ids)) and got != tok.decode(ids)
    text = parse_openai("completion", {**body, "prompt": "Hello there"}, tok, LIMITS, ("m",))
    assert text.prompt_texts == ["Hello there"]
    cut = parse_openai("completion", {**body, "truncate_prompt_tokens": len(ids)}, tok, LIMITS, ("m",))
    assert cut.prompt_texts == [got]


def test_truncate_prompt_tokens_keeps_the_last_ones():
    r = parse(prompt="abcdef", truncate_prompt_tokens=3, echo=True)
    assert r.prompts == [TOK.encode("def")] and r.prompt_texts == ["def"]
    assert parse(prompt="ab", truncate_prompt_tokens=3).prompts == [TOK.encode("ab", add_special_tokens=True)]
    assert len(parse("chat", truncate_prompt_tokens=4).prompts[0]) == 4
    with pytest.raises(OpenAIError):
        parse(truncate_prompt_tokens=0)


def test_a_too_long_prompt_says_maximum_context_length():
    """The phrase client libraries match (OpenAI's, vLLM's), for both limits."""
    for body in ({"prompt": [5] * 101}, {"prompt": [5] * 90, "max_tokens": 40}):
        with pytest.raises(OpenAIError) as e:
            parse(**body)
        assert "maximum context length" in e.value.msg and e.value.param == "prompt"


def assemble(ids: list[int], stops=(), include=False, hidden=frozenset(), min_tokens=0) -> str:
    asm = OutputAssembler(FakeDetokenizer(TOK), tuple(stops), include, frozenset(hidden), min_tokens)
    return "".join(asm.add([i], k == len(ids) - 1) for k, i in enumerate(ids))


def test_stop_strings_count_from_the_token_after_min_tokens():
    """vLLM's rule (its tests/detokenizer/test_min_tokens.py): the first min_tokens tokens' text
    ends nothing; a stop string that ends in a later token's text does, wherever it starts."""
    ids = TOK.encode("one. two. three")  # one id a character
    assert assemble(ids, ["e"]) == "on"
    assert assemble(ids, ["e"], min_tokens=3) == "one. two. thr"
    assert assemble(ids, ["e."], min_tokens=3) == "on"  # ends in token 4: found, as in vLLM
    assert assemble(ids, ["e"], min_tokens=len(ids)) == "one. two. three"
    assert assemble(ids, ["e"], include=True, min_tokens=2) == "one"


def test_include_stop_str_in_output_keeps_the_stop_string():
    ids = TOK.encode("one. two. three")
    assert assemble(ids, [". t"]) == "one"
    assert assemble(ids, [". t"], include=True) == "one. t"
    assert assemble(ids, ["o.", ". t"], include=True) == "one. t"  # the first one found


def test_a_stop_token_s_text_is_left_out_unless_included():
    ids = TOK.encode("abc!")
    bang = ids[-1]
    assert assemble(ids, hidden={bang}) == "abc"
    assert assemble(ids) == "abc!"  # a native eos id: its text as generated
    assert assemble(ids[:-1] + [bang, ids[0]], hidden={bang}) == "abc!a"  # only the one that ended it


def test_stop_token_ids_stop_even_with_ignore_eos_and_are_masked_until_min_tokens():
    sched = make_scheduler()
    params = dict(max_tokens=20, min_tokens=3, ignore_eos=True)
    plain = Request("plain", [1, 2, 3], SamplingParams(**params), eos_token_ids=frozenset({7}))
    stop = Request("stop", [1, 2, 3], SamplingParams(**params, stop_token_ids=(7,)), eos_token_ids=frozenset({7}))
    run(sched, {0: [plain, stop]}, fn=lambda prompt, pos: 7)  # the model always says 7
    assert (plain.finish_reason, plain.num_output_tokens) == ("length", 20)  # eos ignored
    assert (stop.finish_reason, stop.num_output_tokens) == ("stop", 3)
    arrays = sample_arrays([plain, stop])
    assert list(arrays["min_tokens"]) == [0, 3] and arrays["eos_ids"].tolist() == [[7], [7]]
