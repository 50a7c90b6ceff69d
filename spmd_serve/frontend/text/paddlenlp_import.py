"""How a process gets PaddleNLP's `AutoTokenizer`: the whole package, or — in the HTTP workers, which
only tokenize — just its tokenizer classes.

`import paddlenlp` runs `paddlenlp/__init__.py`, which imports every subpackage: taskflow (and
with it HF `datasets`, scikit-learn through seqeval, fastapi through `paddlenlp.server`), data
augmentation, the metrics, mergekit.  That is ~8 of the ~8.5 s a worker spends importing before it
can load a tokenizer (beside a busy CI run), and the worker's start is the server's critical path
(RESULTS.md, "Start-up").  The light import puts the `paddlenlp` package into `sys.modules`
without running its `__init__`, then imports `paddlenlp.data` (first, as `__init__` does:
`data` and `transformers` import each other) and `paddlenlp.transformers`: ~3.5 s, the same
tokenizer classes from the same files.  Any failure (a PaddleNLP whose imports differ) forgets
what it imported and takes the whole import, so the worst case is today's speed.

Only for processes that use nothing else of PaddleNLP (`prefer_light()`, called by
http_worker.main): elsewhere — rank 0's exports, the tests' reference models — `paddlenlp`
must be the whole package.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from typing import Any

log = logging.getLogger(__name__)
_light = False


def prefer_light() -> None:
    """This process only tokenizes: `auto_tokenizer` may skip the rest of PaddleNLP."""
    global _light
    _light = True


def auto_tokenizer() -> Any:
    """PaddleNLP's `AutoTokenizer` class (the light import when preferred and PaddleNLP is not
    imported yet)."""
    if _light and "paddlenlp" not in sys.modules:
        try:
            return _light_import()
        except Exception as e:  # noqa: BLE001 — any failure: the whole import below
            _forget_paddlenlp()
            log.warning(
                "importing PaddleNLP's tokenizers alone failed (%s: %s); importing all of it", type(e).__name__, e
            )
    from paddlenlp.transformers import AutoTokenizer

    return AutoTokenizer


def _light_import() -> Any:
    spec = importlib.util.find_spec("paddlenlp")
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError("No module named 'paddlenlp'")
    package = importlib.util.module_from_spec(spec)  # the package object; its __init__ is not run
    package.__dict__["__version__"] = importlib.metadata.version("paddlenlp")  # (what __init__ would set)
    sys.modules["paddlenlp"] = package
    importlib.import_module("paddlenlp.data")
    transformers = importlib.import_module("paddlenlp.transformers")
    import paddle

    paddle.disable_signal_handler()  # as paddlenlp/__init__ does last
    return transformers.AutoTokenizer


def _forget_paddlenlp() -> None:
    for name in [n for n in sys.modules if n == "paddlenlp" or n.startswith("paddlenlp.")]:
        del sys.modules[name]
