"""Property tests of prefix caching: random workloads whose prompts share system prompts and
whole earlier conversations, under chunked prefill, tight pools (preemption) and aborts.

Every step the harness checks that no block is leaked, that a block is shared only while it is
cached and with its reference count equal to its owners, that no request writes into a block
someone else holds, and (the fake model stores the whole token prefix behind every slot) that a
cached block is only ever read by a request with the identical token prefix.  Every request must
still produce its reference tokens.  Resets of the cache (an operator's /reset_prefix_cache) come at
random steps, while requests share blocks too.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import Scheduler, SchedulerConfig
from tests.support.scheduler_harness import EOS, reference, run

TOKENS = st.integers(100, 104)  # a small alphabet: prefixes collide often, partially and wholly


@st.composite
def workloads(draw, pressure: bool):
    """`pressure`: everything arrives within a few steps into a pool about one request big."""
    block_size = draw(st.integers(1, 4))
    systems = draw(st.lists(st.lists(TOKENS, min_size=1, max_size=12), min_size=1, max_size=3))
    specs: list[tuple[list[int], int]] = []  # (prompt, max_tokens)
    for _ in range(draw(st.integers(3 if pressure else 1, 8))):
        suffix = draw(st.lists(TOKENS, max_size=6))
        if specs and draw(st.booleans()):  # the next turn of an earlier conversation
            prompt, max_tokens = specs[draw(st.integers(0, len(specs) - 1))]
            probe = Request("probe", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            prompt = prompt + reference(probe, 10_000)[0] + suffix
        else:
            prompt = draw(st.sampled_from(systems)) + suffix
        specs.append((prompt, draw(st.integers(1, 6))))
    max_model_len = max(len(p) + m for p, m in specs)
    biggest = -(-max_model_len // block_size)
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 5)),
        num_blocks=biggest + draw(st.integers(0, 2) if pressure else st.integers(0, 3 * biggest)),
        block_size=block_size,
        block_ratio=1.0 if pressure else draw(st.sampled_from([0.3, 0.8, 1.0])),
        max_waiting=len(specs),
        max_num_batched_tokens=draw(st.integers(1, 16)),
        max_model_len=max_model_len,
        enable_prefix_caching=True,
    )
    arrivals: dict[int, list[Request]] = {}
    aborts: dict[int, list[str]] = {}
    for i, (prompt, max_tokens) in enumerate(specs):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        arrive = draw(st.integers(0, 3 if pressure else 30))
        arrivals.setdefault(arrive, []).append(Request(f"r{i}", prompt, params, frozenset({EOS})))
        if draw(st.integers(0, 4)) == 0:
            aborts.setdefault(draw(st.integers(0, 40)), []).append(f"r{i}")
    resets = frozenset(draw(st.lists(st.integers(0, 40), max_size=2)))
    return cfg, arrivals, aborts, resets


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans().flatmap(workloads))
def test_shared_prefixes_keep_every_invariant_and_every_output(workload):
    cfg, arrivals, aborts, resets = workload
    aborted = {rid for rids in aborts.values() for rid in rids}
    trace = run(Scheduler(cfg), arrivals, aborts=aborts, resets=resets)  # invariants and the KV check every step
    hits = sum(o.prefix_hits for o in trace)
    event(f"hits {'> 0' if hits else '0'}, preemptions {'> 0' if any(o.preempted for o in trace) else '0'}")
    assert hits <= sum(o.prefix_queries for o in trace)
    for r in (r for rs in arrivals.values() for r in rs):
        ref, reason = reference(r, cfg.max_model_len)
        if r.req_id in aborted and r.finish_reason == "abort":
            assert r.output_token_ids == ref[: r.num_output_tokens]
            continue
        assert (r.output_token_ids, r.finish_reason) == (ref, reason)
        cached = r.num_cached_tokens
        assert cached is not None and cached % cfg.block_size == 0 and cached < r.num_prompt_tokens
        first = next(s for o in trace for s in o.seqs if s.request is r)
        assert first.start == cached  # the first chunk starts right after the cached prefix
