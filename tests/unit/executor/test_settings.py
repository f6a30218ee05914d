"""Configuration of the two ends: the functions' MTC_COMPUTE=remote and the executor's."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.executor.main import ExecutorSettings
from services.wiring.gcp import GcpRuntime, GcpSettings
from shared.adapters.compute.remote.compute import RemoteCompute
from shared.adapters.compute.remote.pubsub import PubSubRequestSink
from shared.adapters.memory_store import MemoryDocStore


def test_the_functions_send_compute_requests_with_mtc_compute_remote() -> None:
    settings = GcpSettings.from_env({"GOOGLE_CLOUD_PROJECT": "p", "MTC_COMPUTE": "remote",
                                     "MTC_COMPUTE_TTL_S": "45", "MTC_TOPIC_PREFIX": "t-"})
    runtime = GcpRuntime(settings, store=MemoryDocStore())  # no client is made yet
    compute = runtime.compute
    assert isinstance(compute, RemoteCompute) and compute.ttl_s == 45.0
    sink = compute._sink
    assert isinstance(sink, PubSubRequestSink)
    assert sink.topic == "projects/p/topics/t-compute-requests"
    for bad in ("0", "-3", "nan"):
        with pytest.raises(RuntimeError, match="MTC_COMPUTE_TTL_S"):
            GcpSettings.from_env({"GOOGLE_CLOUD_PROJECT": "p", "MTC_COMPUTE": "remote",
                                  "MTC_COMPUTE_TTL_S": bad})
    assert GcpSettings.from_env({"GOOGLE_CLOUD_PROJECT": "p"}).compute == "local"


def test_executor_settings_name_what_is_wrong() -> None:
    ok = ExecutorSettings.from_env({"GOOGLE_CLOUD_PROJECT": "p", "MTC_EXECUTOR_ID": "ctl-1",
                                    "SLURM_CONF": "/etc/slurm.conf", "MTC_STATE_DIR": "/x",
                                    "MTC_EXECUTOR_OPTIONS": '{"agent_probes": ["xid"]}'})
    assert (ok.executor_id, ok.compute, ok.slurm_conf, ok.state_dir) == (
        "ctl-1", "slurm", "/etc/slurm.conf", Path("/x"))
    assert ok.adapter_options() == {"agent_probes": ("xid",)}
    for env, message in (({}, "GOOGLE_CLOUD_PROJECT"),
                         ({"MTC_EXECUTOR_COMPUTE": "vmware"}, "MTC_EXECUTOR_COMPUTE"),
                         ({"MTC_EXECUTOR_ID": "a/b"}, "MTC_EXECUTOR_ID")):
        base = {"GOOGLE_CLOUD_PROJECT": "p"} if "GOOGLE_CLOUD_PROJECT" not in message else {}
        with pytest.raises(SystemExit, match=message):
            ExecutorSettings.from_env({**base, **env})
    with pytest.raises(SystemExit, match="MTC_EXECUTOR_OPTIONS"):
        ExecutorSettings.from_env({"GOOGLE_CLOUD_PROJECT": "p",
                                   "MTC_EXECUTOR_OPTIONS": "[1]"}).adapter_options()
