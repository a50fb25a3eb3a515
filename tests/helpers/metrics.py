"""``/metrics`` read with prometheus_client's own parser, as Prometheus reads it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from helpers.servers import RunningServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: RunningServer) -> Samples:
    answer = server.request("GET", "/metrics", port=server.healthcheck_port)
    assert answer.status == 200, answer.body
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))
