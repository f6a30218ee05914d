"""The executor over the real Pub/Sub emulator: RemoteCompute publishes ordered requests,
the executor pulls, applies each once, refuses what is late (to the dead-letter topic) and
publishes the machines' results to the event topics; its liveness is a Firestore document."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from gcp_support import PROJECT, wait_for

from services.executor.dedup import DedupRecord
from services.executor.executor import APPLIED, DUPLICATE, EXECUTORS, REFUSED, Executor
from shared.adapters import pubsub as ps
from shared.adapters.clock import SystemClock
from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.remote.compute import RemoteCompute
from shared.adapters.compute.remote.pubsub import (
    PubSubRequestSink,
    PubSubRequestSource,
    ensure_request_topology,
)
from shared.adapters.firestore_store import FirestoreDocStore
from shared.adapters.outbox import SourceEmitter
from shared.codec import from_pubsub_message
from shared.domain.events import NodeProvisioned
from tests.contract.compute_drivers import make_node
from tests.harness import ManualClock

pytestmark = pytest.mark.integration


class Machines(LocalCompute):
    """LocalCompute, noting the order cordons reach it (its own cordon is a no-op)."""

    calls: list[tuple[str, ...]]

    def cordon(self, node_id: str, reason: str) -> None:
        self.calls.append(("cordon", node_id, reason))

    def uncordon(self, node_id: str) -> None:
        self.calls.append(("uncordon", node_id))


@pytest.fixture
def prefix(emulators: dict[str, str]) -> Iterator[str]:
    yield f"x{uuid.uuid4().hex[:6]}-"  # topics of this test only


def test_requests_over_pubsub_are_applied_once_in_order_and_results_published(
    prefix: str, tmp_path: Path
) -> None:
    sub = ps.subscriber_client()
    name = ensure_request_topology(PROJECT, "it", prefix=prefix, ack_deadline_s=10)
    publisher = ps.PubSubPublisher(PROJECT, prefix=prefix)
    node_topic = publisher.topic_path(ps.topic_id("node", prefix))
    publisher.client.create_topic(request={"name": node_topic})
    taps = {}
    for topic in (node_topic, publisher.topic_path(ps.dead_letter_topic_id(prefix))):
        path = sub.subscription_path(PROJECT, f"{prefix}tap-{topic.rsplit('/', 1)[1]}")
        sub.create_subscription(request={"name": path, "topic": topic})
        taps[topic.rsplit("/", 1)[1]] = path

    clock = ManualClock(SystemClock().now())
    sink = PubSubRequestSink(PROJECT, prefix=prefix)
    remote = RemoteCompute(sink, clock, ttl_s=30.0)
    machines = Machines(tmp_path / "machines", SourceEmitter(
        publisher.publish, clock, "//mtc/compute/local"), clock, heartbeats=False)
    machines.calls = []
    store = FirestoreDocStore.connect(PROJECT, prefix=prefix)
    executor = Executor(PubSubRequestSource(PROJECT, name), machines,
                        DedupRecord(tmp_path / "ex"), clock, refusals=sink, liveness=store,
                        executor_id="it", kind="local")
    try:
        remote.provision_node(make_node("w0"))
        remote.provision_node(make_node("w0"))  # a handler that ran twice
        for i in range(4):
            remote.cordon("w0", f"fault {i}")
        clock.advance(-31.0)  # issued 31 s ago: past its deadline when the executor pulls
        remote.cordon("w1", "late")
        clock.advance(31.0)
        remote.uncordon("w0")

        wait_for(lambda: (executor.step(timeout_s=2.0), sum(executor.counts.values()))[1] >= 8,
                 timeout_s=30, what="every request handled")
        assert executor.counts[APPLIED] == 6 and executor.counts[DUPLICATE] == 1
        assert executor.counts[REFUSED] == 1
        # in the order asked (one ordering key per node); the late one never applied
        assert machines.calls == [*(("cordon", "w0", f"fault {i}") for i in range(4)),
                                  ("uncordon", "w0")]

        def provisioned() -> list[NodeProvisioned]:
            executor.step(timeout_s=0.5)
            clock.advance(1.0)
            got = [from_pubsub_message({"attributes": dict(m.attributes), "data": m.data})
                   for m in ps.pull(taps[f"{prefix}node"], subscriber=sub)]
            return [e.event for e in got if isinstance(e.event, NodeProvisioned)]

        [event] = wait_for(provisioned, timeout_s=30, what="node.provisioned on the topic")
        assert event.node_id == "w0"
        dead = wait_for(lambda: ps.pull(taps[f"{prefix}dead-letter"], subscriber=sub),
                        timeout_s=20, what="the refusal on the dead-letter topic")
        assert dead[0].attributes["mtc-op"] == "cordon"
        assert "past its deadline" in dead[0].attributes["mtc-reason"]
        executor.beat(force=True)
        [doc] = store.read(EXECUTORS, {})
        assert doc["executor_id"] == "it" and doc["last_seen"] == clock.now()
    finally:
        executor.source.close()  # type: ignore[attr-defined]
        machines.close()
        executor.dedup.close()
