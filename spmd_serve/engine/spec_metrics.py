"""The speculative-decoding metrics (CONTRACT §6), per method, in the engine's registry.

Counters, after every step that verified drafts (`on_step`): `spec_decode_num_drafts_total`
(sequences that verified drafts), `spec_decode_num_draft_tokens_total` (draft tokens verified),
`spec_decode_num_accepted_tokens_total` (those accepted), vLLM's names; and two gauges over the
whole run: `spec_decode_draft_acceptance_rate` = accepted / draft tokens and
`spec_decode_mean_accepted_length` = (accepted + 1 per sequence step) / sequence steps, i.e.
tokens each verifying sequence gained per step.  Labelled `method` (ngram, draft_model, mtp).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from spmd_serve.engine.collectors import PREFIX


class SpecMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p, r = PREFIX + "spec_decode_", registry
        self.drafts = Counter(p + "num_drafts", "Sequence steps that verified draft tokens.", ["method"], registry=r)
        self.draft_tokens = Counter(p + "num_draft_tokens", "Draft tokens verified.", ["method"], registry=r)
        self.accepted = Counter(p + "num_accepted_tokens", "Draft tokens accepted.", ["method"], registry=r)
        self.rate = Gauge(p + "draft_acceptance_rate", "Accepted / verified draft tokens.", ["method"], registry=r)
        self.mean_len = Gauge(
            p + "mean_accepted_length", "Tokens gained per verifying sequence step.", ["method"], registry=r
        )
        self._totals: dict[str, list[int]] = {}  # method -> [sequence steps, draft tokens, accepted]

    def on_step(self, method: str, num_seqs: int, num_draft: int, num_accepted: int) -> None:
        if not num_draft:
            return
        self.drafts.labels(method).inc(num_seqs)
        self.draft_tokens.labels(method).inc(num_draft)
        self.accepted.labels(method).inc(num_accepted)
        t = self._totals.setdefault(method, [0, 0, 0])
        t[0], t[1], t[2] = t[0] + num_seqs, t[1] + num_draft, t[2] + num_accepted
        self.rate.labels(method).set(t[2] / t[1])
        self.mean_len.labels(method).set((t[2] + t[0]) / t[0])
