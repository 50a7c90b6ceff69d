"""Test helper: Prometheus text (as `/metrics` serves it) read with prometheus_client's own parser
into a flat {(sample name, labels): value} view, with deltas between two scrapes."""

from __future__ import annotations

import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

P = "spmd_serve:"


class Samples:
    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.values: dict[tuple[str, frozenset], float] = {
            (s.name, frozenset(s.labels.items())): s.value for f in self.families.values() for s in f.samples
        }

    @classmethod
    def of(cls, registry: CollectorRegistry) -> Samples:
        return cls(generate_latest(registry).decode())

    def get(self, name: str, **labels: str) -> float:
        """Value of one sample; `name` without the spmd_serve: prefix gets it."""
        full = name if name.startswith(("inference_server_metrics", P)) else P + name
        return self.values[(full, frozenset(labels.items()))]

    def original(self) -> dict[str, float]:
        """The `inference_server_metrics` family as {series: value} (label name = its value)."""
        out = {}
        for s in self.families["inference_server_metrics"].samples:
            ((key, val),) = s.labels.items()
            assert key == val, s
            out[key] = s.value
        return out

    def delta(self, before: Samples, name: str, **labels: str) -> float:
        return self.get(name, **labels) - before.get(name, **labels)


def scrape_server(srv) -> Samples:
    """One scrape of a test server's `/metrics` (a tests.support.server_process.ServerProcess)."""
    res = requests.get(f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics", timeout=10)
    return Samples(res.text)


def aborted(srv) -> float:
    """Requests the server's engine has ended as aborted (cancel, client gone, deadline) so far."""
    return scrape_server(srv).get("request_success_total", finished_reason="abort")
