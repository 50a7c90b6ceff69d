"""The trained demo model (export/demo/train.py, committed in export/demo/trained/): its files are
what the recipe makes, its training chats are tokenised exactly as the server tokenises a chat, and
PaddleNLP's own model on its weights answers in English and predicts held-out text better than
chance.  Its draft for speculative decoding (`chat-draft`, trained/draft/) shares its tokenizer and
vocabulary byte for byte, is small enough to commit, and predicts held-out text too."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from spmd_serve.export.demo.checkpoint import (
    END_OF_TURN_ID,
    TRAINED_DIR,
    TRAINED_DIRS,
    make_config,
    train_tokenizer,
    write_demo_checkpoint,
)
from spmd_serve.export.demo.training_data import chat_pairs, chat_text, held_out_texts, sources_digest, tokenizer_extra

HELLO = [("user", "Hello, how are you?")]


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_checkpoint(tmp_path_factory.mktemp("demo") / "chat", "chat")


@pytest.fixture(scope="module")
def draft_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_checkpoint(tmp_path_factory.mktemp("demo") / "chat-draft", "chat-draft")


def _reference(ckpt: Path):
    """PaddleNLP's own model on a checkpoint's weights."""
    from tests.support.paddlenlp_reference import load_reference_model

    return load_reference_model(ckpt)


@pytest.fixture(scope="module")
def model(chat_ckpt: Path):
    return _reference(chat_ckpt)


@pytest.fixture(scope="module")
def draft_model(draft_ckpt: Path):
    return _reference(draft_ckpt)


def test_committed_tokenizer_is_what_the_recipe_trains() -> None:
    recorded = json.loads((TRAINED_DIR / "training.json").read_text())["sources_sha256"]
    if sources_digest() != recorded:  # /usr/share/common-licenses differs: another distribution
        pytest.skip("this machine's training texts differ from those the committed model was trained on")
    assert (
        train_tokenizer(make_config("chat")["vocab_size"], tokenizer_extra())
        == (TRAINED_DIR / "tokenizer.model").read_bytes()
    )


def test_checkpoint_files_and_end_of_turn(chat_ckpt: Path) -> None:
    gen = json.loads((chat_ckpt / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, END_OF_TURN_ID]
    sp = spm.SentencePieceProcessor(model_file=str(chat_ckpt / "tokenizer.model"))
    assert sp.id_to_piece(END_OF_TURN_ID) == "<|end|>"
    training = json.loads((TRAINED_DIR / "training.json").read_text())
    assert training["train_every_50_steps"][-1] < 2.0  # what the committed weights reached


def test_training_chats_are_tokenised_as_the_server_tokenises_a_chat(chat_ckpt: Path) -> None:
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    tok = ServingTokenizer.from_model_dir(chat_ckpt)
    sp = spm.SentencePieceProcessor(model_file=str(chat_ckpt / "tokenizer.model"))
    q, _ = chat_pairs()[0]
    messages = [("system", "Be brief."), ("user", q)]
    served = tok.encode_prompt(messages=[{"role": r, "content": c} for r, c in messages])
    assert served == [1, *sp.encode(chat_text(messages) + "<|assistant|>\n")]


def _greedy_answer(model, sp, messages: list[tuple[str, str]], n: int = 40) -> str:
    from tests.support.paddlenlp_reference import reference_greedy

    prompt = [1, *sp.encode(chat_text(messages) + "<|assistant|>\n")]
    tokens, _ = reference_greedy(model, prompt, n)
    end = tokens.index(END_OF_TURN_ID) if END_OF_TURN_ID in tokens else len(tokens)
    return sp.decode(tokens[:end])


def test_it_answers_hello_in_english(model, chat_ckpt: Path) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(chat_ckpt / "tokenizer.model"))
    assert _greedy_answer(model, sp, HELLO) == dict(chat_pairs())["Hello, how are you?"]
    # a question it never saw still gets words of English, not byte soup
    answer = _greedy_answer(model, sp, [("user", "Could you describe your favourite city?")])
    words = answer.split()
    assert len(words) >= 3 and all(w.strip(".,!?'\"").isascii() for w in words), answer


def _perplexity(model, ckpt: Path, source: str) -> float:
    from tests.support.paddlenlp_reference import token_nll

    texts = held_out_texts()[source]
    if not texts:
        pytest.skip(f"no {source} texts on this machine")
    sp = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
    nll = np.concatenate([token_nll(model, [1, *sp.encode(t)]) for t in texts])
    return math.exp(float(nll.mean()))


@pytest.mark.parametrize("source,share_of_chance", [("corpus", 1.0), ("licences", 0.05)])
def test_held_out_text_is_predicted_better_than_chance(model, chat_ckpt: Path, source, share_of_chance) -> None:
    """Chance is the vocabulary size (a random-weight model, or one that learnt only the corpus
    lines by heart, does worse).  The licences are the bulk of its prose: far better.  The corpus
    lines are varied everyday sentences and it saw some 4000 tokens like them: barely better."""
    perplexity = _perplexity(model, chat_ckpt, source)
    assert perplexity < share_of_chance * make_config("chat")["vocab_size"], perplexity


def test_the_draft_shares_the_chat_models_tokenizer_and_is_small(draft_ckpt: Path, chat_ckpt: Path) -> None:
    for name in ("tokenizer.model", "generation_config.json", "tokenizer_config.json"):
        assert (draft_ckpt / name).read_bytes() == (chat_ckpt / name).read_bytes(), name
    draft, chat = (json.loads((d / "config.json").read_text()) for d in (draft_ckpt, chat_ckpt))
    assert draft["vocab_size"] == chat["vocab_size"] and draft["hidden_size"] < chat["hidden_size"]
    assert (draft_ckpt / "model.safetensors").stat().st_size < 1 << 20  # committed: under 1 MB
    training = json.loads((TRAINED_DIRS["chat-draft"] / "training.json").read_text())
    assert training["preset"] == "chat-draft" and training["seconds"] < 8 * 60  # the brief's CPU budget


def test_the_draft_answers_hello_as_the_chat_model_does_and_predicts_held_out_text(draft_model, draft_ckpt) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(draft_ckpt / "tokenizer.model"))
    assert _greedy_answer(draft_model, sp, HELLO) == dict(chat_pairs())["Hello, how are you?"]
    assert _perplexity(draft_model, draft_ckpt, "licences") < 0.05 * make_config("chat-draft")["vocab_size"]
