"""`spmd_serve bench`: measure a running server the way the field does (vLLM's serving benchmark).

    spmd_serve bench --backend openai-completions --base-url http://127.0.0.1:9965 \\
        --tokenizer /models/small --input-len 128 --output-len 64 --num-prompts 64 \\
        --concurrency 1,4,16,32 --json out.json --plot-dir plots/

Works against any OpenAI-compatible server (`--model` names its model); `native` and `grpc`
speak spmd_serve's own protocols.  The table goes to stdout, the progress bar to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys

from spmd_serve.bench.backends import BACKENDS, Target
from spmd_serve.bench.prompts import load_tokenizer, synthetic_prompts
from spmd_serve.bench.report import plot, table, write_json
from spmd_serve.bench.runner import sweep

DEFAULT_URLS = {"grpc": "127.0.0.1:8811"}  # HTTP backends: http://127.0.0.1:9965


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency values must be >= 1")
    return values


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="spmd_serve bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Metrics (vLLM's definitions): TTFT = first output chunk - send; E2E = last byte - send; "
        "TPOT = (E2E - TTFT) / (output tokens - 1); ITL = gaps between output chunks, per token; "
        "throughput = successful requests (output tokens) / (first send -> last response). "
        "Latencies: mean, median, p99 in ms over successful requests.",
    )
    ap.add_argument(
        "--backend",
        choices=BACKENDS,
        default="openai-completions",
        help="openai-completions: token-id prompts to /v1/completions; openai-chat: text to "
        "/v1/chat/completions (the chat template adds tokens; the server's usage count "
        "is reported); native: spmd_serve's NDJSON protocol; grpc: Triton ModelStreamInfer",
    )
    ap.add_argument(
        "--base-url",
        help="http://HOST:PORT of the HTTP API (default http://127.0.0.1:9965), "
        "or HOST:PORT of the gRPC API (default 127.0.0.1:8811)",
    )
    ap.add_argument("--model", default="default", help="OpenAI `model` field (default: %(default)s)")
    ap.add_argument(
        "--tokenizer",
        default=os.environ.get("MODEL_DIR"),
        help="model directory whose tokenizer builds the prompts (default: $MODEL_DIR)",
    )
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens (default %(default)s)")
    ap.add_argument(
        "--output-len",
        type=int,
        default=128,
        help="output tokens, forced with min_tokens + ignore_eos (default %(default)s)",
    )
    ap.add_argument("--num-prompts", type=int, default=64, help="requests per concurrency level")
    ap.add_argument(
        "--concurrency",
        type=_concurrencies,
        default=[1],
        help="max requests in flight; a comma list (1,4,16) sweeps it",
    )
    ap.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="Poisson arrivals per second; inf (default) releases all at once",
    )
    ap.add_argument("--seed", type=int, default=0, help="prompts and arrival times (default 0)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted requests before each level")
    ap.add_argument("--api-key", default=os.environ.get("API_KEY"), help="bearer token (default $API_KEY)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, s")
    ap.add_argument(
        "--metrics-url", help="a spmd_serve /metrics URL: also report the server's per-step phase split for each level"
    )
    ap.add_argument("--json", metavar="FILE", help="write the config and every level's metrics here")
    ap.add_argument("--plot-dir", metavar="DIR", help="write throughput/latency/TTFT/ITL PNG plots here")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.tokenizer:
        print("spmd_serve bench: --tokenizer MODEL_DIR (or $MODEL_DIR) is needed to build the prompts", file=sys.stderr)
        return 2
    if args.input_len < 1 or args.output_len < 1 or args.num_prompts < 1 or args.warmup < 0:
        print("spmd_serve bench: --input-len, --output-len, --num-prompts must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    base = args.base_url or DEFAULT_URLS.get(args.backend, "http://127.0.0.1:9965")
    target = Target(args.backend, base.rstrip("/"), args.model, args.output_len, args.api_key, args.timeout)
    # fresh prompts for every level and its warm-up (runner.sweep: a repeated prompt measures a cache)
    total = len(args.concurrency) * (args.warmup + args.num_prompts)
    prompts = synthetic_prompts(load_tokenizer(args.tokenizer), total, args.input_len, args.seed)
    runs = asyncio.run(
        sweep(
            target,
            prompts,
            args.concurrency,
            args.request_rate,
            args.seed,
            progress=not args.no_progress,
            warmup=args.warmup,
            metrics_url=args.metrics_url,
        )
    )
    print(
        f"backend {args.backend} at {base}: {args.num_prompts} prompts of {args.input_len} tokens, "
        f"{args.output_len} output tokens, request rate {args.request_rate}"
    )
    print(table(runs))
    config = {k: v for k, v in vars(args).items() if k not in ("api_key", "no_progress")}
    config["request_rate"] = None if math.isinf(args.request_rate) else args.request_rate
    config["base_url"] = base
    if args.json:
        write_json(args.json, config, runs)
    if args.plot_dir:
        plot(args.plot_dir, runs, f"({args.backend}, in {args.input_len}, out {args.output_len})")
    return 1 if all(r.metrics.completed == 0 for r in runs) else 0
