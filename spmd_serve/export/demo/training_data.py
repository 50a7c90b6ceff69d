"""The text the demo chat model is trained on, and the text kept back to measure it (issue 15).

This module owns the data side of `train.py`: nothing is downloaded.

* prose: the hand-written lines of corpus.txt (in paragraphs of four) and the licence texts every
  Debian-like machine has in /usr/share/common-licenses (one document per paragraph; a file that
  is a link to, or a copy of, another is read once), plus corpus.py's template sentences;
* chats: chats.txt's question/answer pairs rendered as the demo chat template renders them, alone,
  after a system prompt, or as the second turn of a conversation.

Every `HOLD_OUT_EVERY`-th corpus line and licence paragraph is never trained on: `held_out_texts`
is what perplexity is measured on.  Everything is a pure function of the files and the seed.
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache
from pathlib import Path

from spmd_serve.export.demo.corpus import _synthetic_sentence, base_sentences

CHATS_PATH = Path(__file__).with_name("chats.txt")
LICENCE_DIR = Path("/usr/share/common-licenses")
HOLD_OUT_EVERY = 8  # lines / paragraphs 7, 15, 23, ... of each source are kept back
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "Be brief.",
    "You are a friendly assistant. Answer in one or two sentences.",
)


def _held_out(i: int) -> bool:
    return i % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1


@lru_cache(maxsize=1)
def licence_files() -> tuple[Path, ...]:
    """The licence texts, by name, each content once (links such as GPL -> GPL-3 skipped)."""
    if not LICENCE_DIR.is_dir():
        return ()
    seen: set[bytes] = set()
    out = []
    for path in sorted(LICENCE_DIR.iterdir()):
        digest = hashlib.sha256(path.read_bytes()).digest() if path.is_file() else b""
        if path.is_symlink() or not digest or digest in seen:
            continue
        seen.add(digest)
        out.append(path)
    return tuple(out)


def sources_digest() -> dict[str, str]:
    """sha256 of every file the data comes from (training.json records it: same digests, same model)."""
    paths = [CHATS_PATH, Path(__file__).with_name("corpus.txt"), *licence_files()]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def _paragraphs(path: Path) -> list[str]:
    """A licence's paragraphs as single lines (its hard wraps and indentation folded); headings dropped."""
    text = path.read_text(encoding="utf-8", errors="replace")
    pars = (" ".join(p.split()) for p in text.split("\n\n"))
    return [p for p in pars if len(p) >= 40]


def _split(items: list[str]) -> tuple[list[str], list[str]]:
    return [s for i, s in enumerate(items) if not _held_out(i)], [s for i, s in enumerate(items) if _held_out(i)]


def held_out_texts() -> dict[str, list[str]]:
    """Texts never trained on, by source: "corpus" lines and "licences" paragraphs."""
    return {
        "corpus": _split(list(base_sentences()))[1],
        "licences": [p for f in licence_files() for p in _split(_paragraphs(f))[1]],
    }


def chat_pairs() -> list[tuple[str, str]]:
    lines = CHATS_PATH.read_text(encoding="utf-8").splitlines()
    return [(q, a) for q, a in (ln.split("\t") for ln in lines if ln.strip() and not ln.startswith("#"))]


def chat_text(messages: list[tuple[str, str]]) -> str:
    """(role, content) messages as the demo chat template renders them, without the BOS token."""
    return "".join(f"<|{role}|>\n{content}<|end|>\n" for role, content in messages)


def prose_documents(seed: int) -> list[str]:
    """The prose training documents: corpus paragraphs, licence paragraphs, template sentences."""
    rng = random.Random(seed)
    lines = _split(list(base_sentences()))[0]
    docs = ["\n".join(lines[i : i + 4]) for i in range(0, len(lines), 4)]
    docs += [p for f in licence_files() for p in _split(_paragraphs(f))[0]]
    docs += [" ".join(_synthetic_sentence(rng) for _ in range(4)) for _ in range(200)]
    return docs


def chat_documents(seed: int, variants: int = 6) -> list[str]:
    """Each pair `variants` times: alone, after a system prompt, or as a conversation's second turn."""
    rng = random.Random(seed)
    pairs = chat_pairs()
    docs = []
    for _ in range(variants):
        for q, a in pairs:
            convo = [("user", q), ("assistant", a)]
            pick = rng.random()
            if pick < 0.3:
                convo.insert(0, ("system", rng.choice(SYSTEM_PROMPTS)))
            elif pick < 0.5:
                q0, a0 = rng.choice(pairs)
                convo = [("user", q0), ("assistant", a0), *convo]
            docs.append(chat_text(convo))
    return docs


def tokenizer_extra() -> list[str]:
    """What the chat preset's tokenizer learns from besides the usual demo text."""
    return [t for q, a in chat_pairs() for t in (q, a)] * 3 + prose_documents(0)
