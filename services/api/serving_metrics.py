"""Prometheus metrics of the endpoints, a ``prometheus_client`` custom collector on
``mtc serve``'s fleet-wide ``/metrics`` (a scrape scoped to one project's clusters does not
get them):

* ``mtc_endpoint_requests_total{endpoint, deployed_model, code}``: predictions by HTTP status
  (503: no replica was ready);
* ``mtc_endpoint_request_seconds{endpoint, deployed_model}``: their latency, a histogram;
* ``mtc_endpoint_replicas{endpoint, deployed_model, state}``: replicas READY, STARTING,
  MOVING (read from the store and the replicas' health at scrape time);
* ``mtc_endpoint_scale_events_total{endpoint, deployed_model, direction}``: the autoscaler's
  changes, up or down.

The counters are this process's (the one that routes); they start at zero with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from services.api.context import RESOURCES, ApiContext
from services.api.serving_router import LATENCY_BUCKETS, STATS, replica_states

STATES = ("READY", "STARTING", "MOVING")


class ServingCollector:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def describe(self) -> list[Metric]:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[Metric]:
        requests, latency, scales = STATS.snapshot()
        counted = CounterMetricFamily("mtc_endpoint_requests", "Predictions by endpoint, "
                                      "deployed model and HTTP status",
                                      labels=["endpoint", "deployed_model", "code"])
        for (endpoint, deployed, code), n in sorted(requests.items()):
            counted.add_metric([endpoint, deployed, code], n)
        yield counted
        hist = HistogramMetricFamily("mtc_endpoint_request_seconds", "Prediction latency at "
                                     "the endpoint", labels=["endpoint", "deployed_model"])
        for (endpoint, deployed), row in sorted(latency.items()):
            buckets = [(f"{b:g}", row[i]) for i, b in enumerate(LATENCY_BUCKETS)]
            hist.add_metric([endpoint, deployed], [*buckets, ("+Inf", row[-2])], row[-1])
        yield hist
        scaled = CounterMetricFamily("mtc_endpoint_scale_events", "Autoscaler changes of a "
                                     "deployed model's replica count",
                                     labels=["endpoint", "deployed_model", "direction"])
        for (endpoint, deployed, direction), n in sorted(scales.items()):
            scaled.add_metric([endpoint, deployed, direction], n)
        yield scaled
        yield self._replicas()

    def _replicas(self) -> Metric:
        gauge = GaugeMetricFamily("mtc_endpoint_replicas", "Serving replicas by state",
                                  labels=["endpoint", "deployed_model", "state"])
        with self.ctx.unit() as uow:
            for record in uow.records(RESOURCES, {"kind": "endpoint"}):
                name = f"{record['parent']}/endpoints/{record['id']}"
                for entry in record["resource"].get("deployedModels") or []:
                    states = Counter(r["state"] for r in replica_states(uow, entry))
                    for state in STATES:
                        gauge.add_metric([name, entry["id"], state], states.get(state, 0))
        return gauge
