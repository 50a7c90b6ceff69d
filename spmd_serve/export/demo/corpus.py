"""Local, deterministic training text for the demo SentencePiece tokenizer.

This module owns the corpus that `spmd_serve.export.demo.checkpoint` trains the demo tokenizer on.
Nothing is downloaded: the hand-written sentences live next to this file in `corpus.txt`, and
`training_sentences()` stretches them with template sentences built from small word lists and
made-up words so that even the 8000-piece "small" vocabulary has enough distinct merges to learn.

Everything is a pure function of its arguments (a private `random.Random(seed)`; no global
state, no set/dict iteration order that could differ between runs), because the checkpoint
writer promises byte-identical tokenizer files for the same seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

CORPUS_PATH = Path(__file__).with_name("corpus.txt")

# Word lists for the template sentences.  They are ordinary words on purpose: the demo model is
# random, but a tokenizer whose pieces look like English makes the served text easier to read.
_NAMES = [
    "Alice",
    "Bob",
    "Carmen",
    "Deepak",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ingrid",
    "Jonas",
    "Kofi",
    "Lena",
    "Mateo",
    "Nadia",
    "Oscar",
    "Priya",
    "Quentin",
    "Rosa",
    "Samir",
    "Tara",
    "Umar",
    "Vera",
    "Wei",
    "Ximena",
    "Yusuf",
    "Zoe",
]
_PLACES = [
    "the station",
    "the harbor",
    "the library",
    "the market",
    "the old mill",
    "the mountain hut",
    "the river bank",
    "the school yard",
    "the museum",
    "the bakery",
    "the lighthouse",
    "the city hall",
    "the airport",
    "the forest edge",
    "the bridge",
]
_VERBS = [
    "found",
    "painted",
    "carried",
    "repaired",
    "described",
    "counted",
    "borrowed",
    "measured",
    "ordered",
    "discovered",
    "forgot",
    "explained",
    "delivered",
    "sold",
    "planted",
    "tested",
    "opened",
    "photographed",
    "wrapped",
    "compared",
]
_ADJECTIVES = [
    "quiet",
    "bright",
    "heavy",
    "curious",
    "ancient",
    "tiny",
    "enormous",
    "gentle",
    "broken",
    "shiny",
    "strange",
    "careful",
    "noisy",
    "golden",
    "patient",
    "rusty",
]
_NOUNS = [
    "lantern",
    "bicycle",
    "letter",
    "garden",
    "violin",
    "compass",
    "basket",
    "window",
    "teapot",
    "notebook",
    "ladder",
    "blanket",
    "engine",
    "mirror",
    "kettle",
    "umbrella",
    "telescope",
    "sandwich",
    "keyboard",
    "pebble",
    "feather",
    "candle",
    "harvest",
]
_TIMES = [
    "on Monday",
    "at dawn",
    "after lunch",
    "last winter",
    "in 1987",
    "before midnight",
    "every Sunday",
    "at 7:45",
    "during the storm",
    "in early spring",
    "yesterday",
]
_TEMPLATES = [
    "{name} {verb} a {adj} {noun} near {place} {time}.",
    "{time_cap}, {name} {verb} {num} {noun}s at {place}.",
    "Why did {name} say the {noun} was {adj}? Nobody at {place} knew.",
    "The {adj} {noun} that {name} {verb} cost ${num}.{cents}.",
    '"Look at this {noun}!" {name} said {time} at {place}.',
    "{name} and {name2} {verb} the {adj} {noun}; it took {num} minutes.",
    "In {place}, the {noun} of {word} is {adj} and {adj2}.",
    "{word_cap} is the {adj} {noun} that {name} {verb} {time}.",
]

# Syllables for made-up words ("velmora", "trastin"): they give BPE an open-ended supply of new
# letter pairs to merge, which is what lets an 8000-piece vocabulary train on a small corpus.
_ONSETS = [
    "b",
    "br",
    "c",
    "ch",
    "d",
    "dr",
    "f",
    "fl",
    "g",
    "gr",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "pl",
    "qu",
    "r",
    "s",
    "sh",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "w",
    "z",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "nd", "st", "m", "x", "k"]


@lru_cache(maxsize=1)
def base_sentences() -> tuple[str, ...]:
    """The hand-written lines of corpus.txt (blank lines dropped, order kept)."""
    text = CORPUS_PATH.read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def _made_up_word(rng: random.Random) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.randint(2, 3)))


def _synthetic_sentence(rng: random.Random) -> str:
    name, name2 = rng.sample(_NAMES, 2)
    adj, adj2 = rng.sample(_ADJECTIVES, 2)
    time = rng.choice(_TIMES)
    word = _made_up_word(rng)
    return rng.choice(_TEMPLATES).format(
        name=name,
        name2=name2,
        verb=rng.choice(_VERBS),
        adj=adj,
        adj2=adj2,
        noun=rng.choice(_NOUNS),
        place=rng.choice(_PLACES),
        time=time,
        time_cap=time[0].upper() + time[1:],
        num=rng.randint(2, 999),
        cents=f"{rng.randint(0, 99):02d}",
        word=word,
        word_cap=word.capitalize(),
    )


def training_sentences(n_synthetic: int = 20000, repeats: int = 3, seed: int = 1234) -> Iterator[str]:
    """Yield the tokenizer's training sentences, deterministically for a given argument tuple.

    The hand-written lines are repeated `repeats` times (so real words outweigh the made-up
    ones and become whole pieces first), interleaved with `n_synthetic` template sentences.
    """
    rng = random.Random(seed)
    base = base_sentences()
    for _ in range(repeats):
        yield from base
        for _ in range(n_synthetic // max(repeats, 1)):
            yield _synthetic_sentence(rng)


def sample_texts() -> list[str]:
    """A few corpus lines covering ASCII, digits, punctuation, Chinese and emoji (for tests)."""
    base = base_sentences()
    picks = [base[0], base[4]]
    picks += [s for s in base if any("\u4e00" <= ch <= "\u9fff" for ch in s)][:2]
    picks += [s for s in base if any(ord(ch) >= 0x1F300 for ch in s)][:2]
    return picks
