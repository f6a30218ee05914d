"""Each part installs only its extra (pyproject.toml): its entry points must import, and run,
with every other part's packages absent. Each check is a subprocess whose import system
refuses the packages the part's extra does not bring (as if they were not installed)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PYTHONPATH = f"{ROOT}:{ROOT / 'shared' / 'sdk'}"  # the checkout's code, the SDK's source root too

# distribution name -> the top-level modules it provides
MODULES = {
    "cloudevents": ["cloudevents"], "pyyaml": ["yaml"], "requests": ["requests"],
    "numpy": ["numpy"], "google-auth": ["google.auth"],
    "google-cloud-pubsub": ["google.cloud.pubsub", "google.cloud.pubsub_v1"],
    "functions-framework": ["functions_framework", "flask", "werkzeug"],
    "google-cloud-firestore": ["google.cloud.firestore", "google.cloud.firestore_v1"],
    "google-cloud-workflows": ["google.cloud.workflows"],
    "google-cloud-compute": ["google.cloud.compute", "google.cloud.compute_v1"],
    "pydantic": ["pydantic"], "optuna": ["optuna"], "prometheus-client": ["prometheus_client"],
    "rich": ["rich"], "tensorboardX": ["tensorboardX"], "simpy": ["simpy"],
    "matplotlib": ["matplotlib"], "waitress": ["waitress"], "google-crc32c": ["google_crc32c"],
    "torch": ["torch"], "transformers": ["transformers"],
    "py-spy": [],  # a program run as a subprocess (a hung rank's stack): nothing to import
}
BLOCKER = r'''
import importlib.abc, runpy, sys
BLOCKED = {blocked!r}
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in this extra)", name=name)
        return None
sys.meta_path.insert(0, Absent())
{body}
'''


def project() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip()
            for r in requirements}


def blocked_for(extra: str) -> list[str]:
    proj = project()
    allowed = names(proj["dependencies"]) | names(proj["optional-dependencies"][extra])
    others = set().union(*(names(v) for k, v in proj["optional-dependencies"].items()
                           if k != "dev"))
    return sorted(m for dist in others - allowed for m in MODULES[dist])


def run(extra: str, body: str) -> subprocess.CompletedProcess[str]:
    code = BLOCKER.format(blocked=blocked_for(extra), body=body)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": PYTHONPATH,
                                                       "PATH": "/usr/bin:/bin"})


def test_every_extra_names_packages_this_test_knows() -> None:
    proj = project()
    for extra, reqs in proj["optional-dependencies"].items():
        if extra != "dev":
            assert names(reqs) <= set(MODULES), extra
    assert names(proj["dependencies"]) <= set(MODULES)
    assert "mtc[agent,gcp,server,sim,torch]" in proj["optional-dependencies"]["dev"]


def test_the_blocker_blocks() -> None:
    proc = run("agent", "import simpy")
    assert proc.returncode != 0 and "not in this extra" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "body"), [
    # the node agent: its CLI and a full probe run, without simpy, matplotlib, flask...
    ("agent", "import services.node_agent.cli\n"
              "from shared.probes.agent import collect\n"
              "sys.argv = ['mtc-agent', '--help']\n"
              "try:\n    runpy.run_module('services.node_agent', run_name='__main__')\n"
              "except SystemExit as e:\n    assert e.code == 0, e.code\n"),
    # the functions (the root main.py the deployment runs), the Compute Engine adapter,
    # its power-saving programs and the workflow starter: no simpy, no matplotlib, no rich
    ("gcp", "import main\n"
            "import shared.adapters.compute.gce.compute, shared.adapters.compute.gce.power\n"
            "import shared.adapters.compute.gce.split, shared.adapters.workflows\n"
            "from google.cloud import compute_v1, workflows\n"
            "sys.argv = ['gce_power', '--help']\n"
            "try:\n    runpy.run_module('shared.adapters.compute.gce.power', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"),
    ("sim", "import simulator.cli\n"),
    # the in-job SDK's core with numpy alone (its packaging test installs it by itself)
    ("program", "import mtc_program.tiers, mtc_program.cut, mtc_program.progress\n"
                "import mtc_program.inprocess, mtc_program.env, mtc_program.scalars\n"
                "assert not {'shared', 'services', 'simulator'} & {m.split('.')[0] for m in sys.modules}\n"),
])
def test_each_part_runs_with_only_its_extra(extra: str, body: str) -> None:
    proc = run(extra, body)
    assert proc.returncode == 0, f"{extra}: {proc.stderr[-2000:]}"
    assert "simpy" in blocked_for("agent") and "matplotlib" in blocked_for("gcp")
