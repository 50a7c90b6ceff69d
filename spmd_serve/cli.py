"""The `spmd_serve` console script: `spmd_serve [flags]` serves (under mpirun);
`spmd_serve export ...` writes a served model directory; `spmd_serve bench ...` measures a server."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "export":
        from spmd_serve.export import main as export_main

        return export_main(argv[1:])
    if argv and argv[0] == "bench":
        from spmd_serve.bench.cli import main as bench_main
        from spmd_serve.frontend.text import paddlenlp_import

        # a bench process only tokenizes: PaddleNLP's tokenizer classes alone, as in the HTTP workers
        # (not its taskflow, datasets, scikit-learn: ~5 s of CPU a run)
        paddlenlp_import.prefer_light()
        return bench_main(argv[1:])
    if argv and argv[0] == "serve":
        argv = argv[1:]
    from spmd_serve.config import exit_on_config_error, load_config
    from spmd_serve.server import _quiet_paddle, serve

    _quiet_paddle()
    cfg = exit_on_config_error(load_config)(argv)
    return serve(cfg)


if __name__ == "__main__":
    sys.exit(main())
