"""The HTTP workers' light PaddleNLP import (spmd_serve/frontend/text/paddlenlp_import.py): the same
tokenizer and ids as the whole import, without taskflow / datasets / scikit-learn / fastapi, and the
whole import when the light one fails.  The light cases in their own interpreters (imports are per
process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spmd_serve.export.demo.checkpoint import write_demo_checkpoint
from spmd_serve.export.demo.corpus import sample_texts

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("sklearn", "datasets", "fastapi", "paddlenlp.taskflow", "paddlenlp.dataaug")
PROBE = """
import json, sys
from spmd_serve.frontend.text import paddlenlp_import
MODE = sys.argv[2]
paddlenlp_import.prefer_light()
if MODE == "broken":  # a light import that fails at its end: all it imported must be forgotten
    light = paddlenlp_import._light_import
    def failing():
        light()
        raise ImportError("simulated")
    paddlenlp_import._light_import = failing
from spmd_serve.frontend.text.tokenizer import ServingTokenizer
tok = ServingTokenizer.from_model_dir(sys.argv[1])
texts = json.loads(sys.stdin.read())
print(json.dumps({"ids": [tok.encode(t) for t in texts], "decoded": [tok.decode(tok.encode(t)) for t in texts],
                  "class": type(tok._tok).__name__, "eos": tok.eos_token_ids,
                  "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The light and the failing-light import in their own interpreters (at once: ~10 s each), the
    whole import in this one (as everywhere but the workers)."""
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    ckpt = write_demo_checkpoint(tmp_path_factory.mktemp("demo") / "tiny", "tiny", seed=0)
    texts = [*sample_texts()[:20], "Hello, world! 2 + 2 = 4.", "今天天气很好 🎉 ümlaut <s> </s>"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = {
        mode: subprocess.Popen(
            [sys.executable, "-c", PROBE, str(ckpt), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for mode in ("light", "broken")
    }
    out = {}
    for mode, proc in procs.items():
        stdout, stderr = proc.communicate(json.dumps(texts), timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        out[mode] = json.loads(stdout.strip().splitlines()[-1]) | {"stderr": stderr}
    tok = ServingTokenizer.from_model_dir(ckpt)
    out["whole"] = {
        "ids": [tok.encode(t) for t in texts], "decoded": [tok.decode(tok.encode(t)) for t in texts],
        "class": type(tok._tok).__name__, "eos": tok.eos_token_ids, "heavy": [m for m in HEAVY if m in sys.modules],
    }  # fmt: skip
    return out


def test_the_light_import_gives_the_whole_imports_tokenizer(runs) -> None:
    whole, light = runs["whole"], runs["light"]
    assert light["class"] == whole["class"] == "LlamaTokenizer"
    assert light["ids"] == whole["ids"] and light["decoded"] == whole["decoded"] and light["eos"] == whole["eos"]


def test_the_light_import_skips_the_heavy_subpackages(runs) -> None:
    assert runs["light"]["heavy"] == []
    assert set(runs["whole"]["heavy"]) == set(HEAVY)  # (what the light import saves: all of them)


def test_a_failing_light_import_falls_back_to_the_whole_one(runs) -> None:
    broken = runs["broken"]
    assert "importing PaddleNLP's tokenizers alone failed (ImportError: simulated)" in broken["stderr"]
    assert broken["ids"] == runs["whole"]["ids"] and set(broken["heavy"]) == set(HEAVY)
