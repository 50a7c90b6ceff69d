"""vLLM's /tokenize and /detokenize bodies (spmd_serve/frontend/openai/tokenize.py): what they answer
and what they refuse, naming the field.  Served: tests/mpi/test_vllm_extras_mpi.py."""

from __future__ import annotations

import pytest

from spmd_serve.frontend.openai.body import OpenAIError
from spmd_serve.frontend.openai.tokenize import detokenize, tokenize
from tests.support.fakes import BOS, FakeTokenizer

TOK = FakeTokenizer()
NAMES = ("m",)


def test_tokenize_a_prompt_or_messages():
    assert tokenize({"prompt": "ab"}, TOK, NAMES, 99) == {
        "count": 3, "max_model_len": 99, "tokens": [BOS, *TOK.encode("ab")], "token_strs": None,
    }  # fmt: skip
    plain = tokenize(
        {"model": "m", "prompt": "ab", "add_special_tokens": False, "return_token_strs": True}, TOK, NAMES, 9
    )
    assert (plain["tokens"], plain["token_strs"]) == (TOK.encode("ab"), ["a", "b"])
    chat = tokenize({"messages": [{"role": "user", "content": "hi"}]}, TOK, NAMES, 99)
    assert chat["tokens"] == TOK.encode_prompt(messages=[{"role": "user", "content": "hi"}])
    cont = tokenize({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False}, TOK, NAMES, 99)
    assert cont["count"] < chat["count"]  # no "<assistant>" turn opened


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "a", "messages": [{"role": "user", "content": "hi"}]}, "prompt"),
        ({}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "a", "model": "other"}, "model"),
        ({"prompt": "a", "temperature": 0}, "temperature"),
        ({"prompt": "a", "return_token_strs": "yes"}, "return_token_strs"),
        ({"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": True}, "add_special_tokens"),
        ({"messages": []}, "messages"),
    ],
)
def test_tokenize_refusals_name_the_field(body, param):
    with pytest.raises(OpenAIError) as e:
        tokenize(body, TOK, NAMES, 99)
    assert (e.value.status, e.value.param) == (400 if param != "model" else 404, param)


def test_detokenize_writes_special_tokens_and_refuses_ids_outside_the_vocabulary():
    assert detokenize({"tokens": [BOS, *TOK.encode("hé")]}, TOK, NAMES) == {"prompt": "hé"}
    assert detokenize({"tokens": [], "model": "m"}, TOK, NAMES) == {"prompt": ""}
    for bad in ([TOK.vocab_size], [-1], "12", [1.5]):
        with pytest.raises(OpenAIError) as e:
            detokenize({"tokens": bad}, TOK, NAMES)
        assert e.value.param == "tokens"
