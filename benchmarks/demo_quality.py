"""Perplexity of the trained demo model on held-out text, per served variant (issue 15 item 4).

    python benchmarks/demo_quality.py [--json OUT]

Exports the "chat" demo checkpoint as float32, weight-only int8 and weight-only int4 (TP=1), then
runs each under `mpirun -n 1` in --worker mode (the float32 one twice: fp32 KV pool and int8 KV
pool).  The worker decodes every held-out text (export/demo/training_data.py `held_out_texts`:
corpus lines and licence paragraphs never trained on) through the offline engine with a
teacher-forcing sampler: the prompt is BOS, each step's "sampled" token is the text's next token
and its log-probability under the served logits is recorded, so every token but the first comes
from a real decode step reading the paged KV pool.  Perplexity = exp(mean negative log-likelihood),
over all held-out tokens and per source; also for PaddleNLP's own dygraph model on the checkpoint
(the fp32 reference).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.support
VARIANTS = (("fp32", None, False), ("int8", "weight_only_int8", False), ("int4", "weight_only_int4", False))


def held_out_ids(tokenizer_dir: str) -> list[list[int]]:
    """Every held-out text (export/demo/training_data.py: corpus lines, licence paragraphs), BOS first."""
    import sentencepiece as spm

    from spmd_serve.export.demo.training_data import held_out_texts

    sp = spm.SentencePieceProcessor(model_file=f"{tokenizer_dir}/tokenizer.model")
    return [[1, *sp.encode(t)] for texts in held_out_texts().values() for t in texts]


def worker(model_dir: str, kv_int8: bool, out_path: str) -> None:
    """Under mpirun: teacher-forced decode of every held-out line; writes {"nll": [...per line]}."""
    from spmd_serve.engine.engine import worker_loop
    from spmd_serve.engine.offline import EngineSettings, make_engine, open_ranks
    from spmd_serve.engine.sampler import SampledStep, Sampler, token_logprobs
    from spmd_serve.protocol import StepPlan
    from spmd_serve.sampling_params import SamplingParams
    from spmd_serve.scheduler.request import Request

    lines = held_out_ids(model_dir)
    nll: dict[str, list[float]] = {str(i): [] for i in range(len(lines))}

    class TeacherForcing(Sampler):
        def sample(self, out: Any, logits: np.ndarray) -> SampledStep:
            rows = [i for i, s in enumerate(out.seqs) if s.samples]
            reqs = [out.seqs[i].request for i in rows]
            tokens = [lines[int(r.req_id)][1 + r.num_output_tokens] for r in reqs]
            for i, r, t in zip(rows, reqs, tokens):
                nll[r.req_id].append(-token_logprobs(logits[i], t, 0)[0])
            return SampledStep(reqs, tokens, {})

    s = EngineSettings(num_blocks=256, block_size=16, max_num_seqs=len(lines), kv_int8=kv_int8)
    comm, runner = open_ranks(model_dir, s)
    if comm.rank != 0:
        worker_loop(comm, runner)
        return
    engine = make_engine(comm, runner, model_dir, s, len(lines), TeacherForcing())
    for i, ids in enumerate(lines):
        engine.scheduler.add_request(Request(str(i), ids[:1], SamplingParams(max_tokens=len(ids) - 1, ignore_eos=True)))
    while engine.scheduler.has_unfinished():
        engine.step()
    comm.send_plan(StepPlan.shutdown(engine.step_id + 1))
    Path(out_path).write_text(json.dumps({"nll": [nll[str(i)] for i in range(len(lines))]}))


def reference_nll(ckpt: Path) -> list[list[float]]:
    """PaddleNLP's dygraph LlamaForCausalLM on the checkpoint (the fp32 reference), per text."""
    from tests.support.paddlenlp_reference import load_reference_model, token_nll

    model = load_reference_model(ckpt)
    return [[float(x) for x in token_nll(model, ids)] for ids in held_out_ids(str(ckpt))]


def perplexities(nll: list[list[float]]) -> dict[str, Any]:
    """Perplexity over all held-out tokens and per source (the texts come corpus first)."""
    from spmd_serve.export.demo.training_data import held_out_texts

    n_corpus = len(held_out_texts()["corpus"])
    parts = {"all": nll, "corpus": nll[:n_corpus], "licences": nll[n_corpus:]}
    flat = {k: [x for line in v for x in line] for k, v in parts.items()}
    return {"tokens": len(flat["all"]), **{k: round(math.exp(float(np.mean(v))), 3) for k, v in flat.items() if v}}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3] == "1", sys.argv[4])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args()
    from spmd_serve.export import export_checkpoint
    from spmd_serve.export.demo.checkpoint import write_demo_checkpoint
    from tests.support.server_process import mpi_env, mpirun

    root = Path(tempfile.mkdtemp(prefix="demo-quality-"))
    ckpt = write_demo_checkpoint(root / "ckpt", "chat")
    rows: dict[str, Any] = {}
    ref = reference_nll(ckpt)
    rows["paddlenlp fp32 (reference)"] = ref
    for name, quant, _ in VARIANTS:
        served = export_checkpoint(ckpt, root / name, tp=1, quant=quant)
        for kv_int8 in (False, True) if quant is None else (False,):
            label = f"{name} weights" + (", int8 KV" if kv_int8 else "")
            out = root / f"{name}-{int(kv_int8)}.json"
            cmd = mpirun(1, sys.executable, __file__, "--worker", str(served), str(int(kv_int8)), str(out))
            subprocess.run(cmd, check=True, env=mpi_env())
            rows[label] = json.loads(out.read_text())["nll"]
    table = {k: perplexities(v) for k, v in rows.items()}
    base = table["fp32 weights"]["all"]
    for v in table.values():
        v["all_vs_fp32"] = round(v["all"] / base, 4)
    print(json.dumps(table, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
