"""`make stack` end to end: the emulators, every function as its own functions-framework
server (MTC_BACKEND=gcp), Pub/Sub push, LocalCompute with real worker processes, and the
self-healing story; everything it started is gone afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stack_support import pids_of, run_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_stack_tells_the_self_healing_story(emulators: dict[str, str],
                                            tmp_path: Path) -> None:
    state = tmp_path / "stack"
    # 200 steps (about 10 s of training): the drain must land before the job ends, and on a
    # loaded machine the repair function took 3 s to act on the diagnosis (80 steps left 2.5 s)
    out = run_script("stack.py", "--state-dir", str(state), "--steps", "200", timeout_s=300)
    for line in ("diagnosed gpu_fell_off_bus", "draining, job train-1 must checkpoint",
                 "attempt 1 workers exited, code", "requeued (restart 1)",
                 "attempt 2 started", "resuming from checkpoint step", "repair started: reboot",
                 "back in service", "JOB_STATE_SUCCEEDED after 1 restart(s)",
                 "via pubsub", "stopped functions", "stopped pubsub", "stopped firestore",
                 # the story went through the Vertex AI API: an Operation waited on, a job
                 # submitted with its customJobId, the node list read back
                 "locations/us-central1/modelDevelopmentClusters/demo READY",
                 "locations/us-central1/customJobs/train-1 submitted",
                 "GET .../modelDevelopmentClusters/demo/nodes"):
        timeline = "\n".join(x for x in out.splitlines() if "via pubsub" in x or ">>>" in x)
        assert line in out, f"missing {line!r} in:\n{timeline}"
    assert not pids_of(str(state)), "something the stack started is still running"
