"""`mtc recipe` on the embedded default: list and show read the packaged files; `run` of the
tiny pretrain is an ordinary CustomJob (real worker processes, real torch) that ends
SUCCEEDED with its loss in the recipe's range, and its model lands in the registry with the
lineage: the job, its checkpoint, the recipe's name and version."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_support import cluster_body, mtc, mtc_json, write

pytestmark = pytest.mark.slow
pytest.importorskip("transformers.models.llama.modeling_llama")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    spec = write(tmp_path / "cluster.json", cluster_body())
    assert mtc_json(state, "cluster", "create", "demo", "-f", str(spec), "--wait", "20"
                    )["state"] == "READY"
    yield state
    from services.wiring.embedded import embedded

    app = embedded(state)
    app.compute.kill_all()
    app.close()


def test_list_and_show_need_no_state(tmp_path: Path) -> None:
    state = tmp_path / "none"
    listed = {r["name"]: r for r in mtc_json(state, "recipe", "list")}
    assert {"pretrain", "sft", "continued-pretraining"} <= listed.keys()
    assert listed["pretrain"]["version"] == 1 and "tiny" in listed["pretrain"]["sizes"]
    shown = mtc_json(state, "recipe", "show", "sft", "--size", "tiny", "--set",
                     "hyperparameters.steps=5")
    assert shown["hyperparameters"]["steps"] == 5 and shown["task"] == "sft"
    bad = mtc(state, "recipe", "show", "pretrain", "--set", "model.family=gpt", check=False)
    assert bad.returncode == 2 and "model.family" in bad.stderr
    assert not state.exists()  # nothing opened a state directory


def test_run_tiny_pretrain_registers_the_model_with_its_lineage(cluster: Path) -> None:
    result = mtc_json(cluster, "recipe", "run", "pretrain", "--size", "tiny", "--cluster",
                      "demo", "--job-id", "pre1", "--timeout", "240")
    assert result["state"] == "JOB_STATE_SUCCEEDED" and result["withinExpected"] is True
    low, high = result["expectedLoss"]
    assert low <= result["finalLoss"] <= high
    job = mtc_json(cluster, "job", "get", "pre1")
    assert job["labels"]["mtc-recipe"] == "pretrain"
    assert [p["replicaCount"] for p in job["jobSpec"]["workerPoolSpecs"]] in ([1], ["1"])
    assert Path(result["artifactUri"], "model.safetensors").is_file()
    metrics = json.loads(Path(result["artifactUri"], "metrics.json").read_text())
    assert metrics["final_loss"] == pytest.approx(result["finalLoss"], abs=1e-6)

    from services.api import models
    from services.api.names import parent
    from services.cli.client import LocalClient
    from services.wiring.embedded import embedded

    app = embedded(cluster)
    try:
        client = LocalClient(app)
        model = models.get(client.ctx, parent("local", "local"), result["model"].rsplit("/")[-1])
    finally:
        app.close()
    assert model["labels"]["mtc-recipe"] == "pretrain"
    assert model["labels"]["mtc-recipe-version"] == "1"
    assert model["metadata"]["finalLoss"] == result["finalLoss"]
    lineage = model["mtcLineage"]
    assert lineage["job"] == "projects/local/locations/local/customJobs/pre1"
    assert lineage["checkpointStep"] == "60"  # the DCP directory the control plane scanned
    assert lineage["inputs"]["command"][1:] == ["-m", "services.recipes.programs.lm"]


def test_over_the_api_a_missing_parent_model_is_the_servers_not_found(tmp_path: Path) -> None:
    """`recipe run` goes through --api like `job submit`: the parent model is looked up on the
    server (HttpClient.get_model), and nothing is submitted when it is not there."""
    from tests.integration.test_cli_remote import server as serve_fixture

    gen = serve_fixture.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    srv = next(gen)
    try:
        proc = srv.run("recipe", "run", "sft", "--size", "tiny", "--cluster", "demo",
                       "--set", "parent_model=nope", check=False)
        assert proc.returncode == 2 and "NOT_FOUND" in proc.stderr, proc.stderr
        assert srv.json("job", "list") == []
        assert {r["name"] for r in srv.json("recipe", "list")} >= {"pretrain", "sft"}
    finally:
        next(gen, None)


def test_run_rl_checks_its_reward_and_registers_the_model(cluster: Path) -> None:
    """`mtc recipe run rl`: its own program (python -m services.recipes.programs.rl) as a
    CustomJob; the reward at RL's start and end is read from rank 0's log, checked against the
    recipe's expected_reward, and registered with the model. Two ranks data parallel over
    gloo with KL to the reference (their collectives matched, or the job would hang), a few
    steps and an expectation it cannot miss (the gain at tiny size is test_recipe_losses')."""
    short = ["--size", "tiny", "--cluster", "demo", "--set", "rl.sft_steps=3", "--set",
             "hyperparameters.steps=2", "--set", "rl.eval_prompts=8", "--set",
             "rl.prompts_per_step=2", "--set", "checkpoint.every=0",
             "--set", "parallelism.replicas=2", "--set", "rl.kl_coef=0.05"]
    result = mtc_json(cluster, "recipe", "run", "rl", *short, "--job-id", "rl1",
                      "--set", "expected_reward.min=0", "--set", "expected_reward.min_gain=-1")
    assert result["state"] == "JOB_STATE_SUCCEEDED" and result["withinExpected"] is True
    metrics = json.loads(Path(result["artifactUri"], "metrics.json").read_text())
    assert metrics["reward_end"] == pytest.approx(result["rewardEnd"], abs=1e-6)
    assert metrics["reward_start"] == pytest.approx(result["rewardStart"], abs=1e-6)
    assert metrics["steps"] == 5
    job = mtc_json(cluster, "job", "get", "rl1")
    pools = job["jobSpec"]["workerPoolSpecs"]
    assert [int(p["replicaCount"]) for p in pools] == [1, 1]
    assert pools[0]["containerSpec"]["command"][1:] == ["-m", "services.recipes.programs.rl"]
    assert job["labels"]["mtc-recipe"] == "rl"



def test_run_sft_with_deploy_ends_in_an_endpoint_that_completes_a_prompt(cluster: Path
                                                                         ) -> None:
    """The one end-to-end proof that a recipe ends in an endpoint: a short SFT run (its loss
    range widened: 40 steps do not reach the recipe's), registered, deployed on one replica
    of the prebuilt PyTorch runtime, and asked the recipe's kind of prompt."""
    result = mtc_json(cluster, "recipe", "run", "sft", "--size", "tiny", "--cluster", "demo",
                      "--job-id", "sft-d", "--set", "hyperparameters.steps=40", "--set",
                      "expected_loss.max=100", "--timeout", "240", "--deploy")
    served = result["deployed"]
    assert served["endpoint"] == "projects/local/locations/local/endpoints/sft-sft-d"
    assert served["prompt"] == "12+30=" and isinstance(served["completion"], str)
    endpoint = mtc_json(cluster, "endpoint", "get", "sft-sft-d")
    [deployed] = endpoint["deployedModels"]
    assert deployed["model"] == result["model"] and deployed["modelVersionId"] == "1"
    assert [r["state"] for r in deployed["mtcReplicas"]] == ["READY"]
    again = mtc(cluster, "endpoint", "predict", "sft-sft-d", "--instances", '["12+30="]').stdout
    assert json.loads(again) == [served["completion"]]  # greedy: the same completion
