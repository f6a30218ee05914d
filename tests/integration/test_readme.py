"""README's doctest: its curl block and its SDK and tuning examples run exactly as printed
against a live ``mtc serve`` (in a temporary directory, its default state dir ``var/mtc``), so
README cannot drift from what the code does again (a fresh clone's first hour once found
``serve --state-dir`` refused and placeholders no reader could run).

Every fenced block of README is either run here or listed in ``SKIP`` with the reason it is
not; a new block fails the test until it is one or the other. The one liberty taken: the
server listens on a free port, named to the block by ``MTC_API`` (README's block reads it,
defaulting to 8080), and it runs as ``python -m services.cli.main serve`` (what
``.venv/bin/mtc serve`` is) so the test needs no installed entry point.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving import serve_subprocess

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

# A block's first line (its start) -> why the test does not run it.
SKIP: dict[str, str] = {
    "make demo ": "make targets: they install a virtualenv or start Slurm and the emulators; "
                 "make demo is tests/integration/test_demo.py, make stack* and demo-slurm "
                 "are tests/integration/gcp and slurm, and mtc serve is what this test runs",
    "   0.77s  job train-1": "make demo's output, not a command (tests/integration/test_demo.py)",
    "             HTTP API / `mtc` CLI": "the architecture diagram",
    "mtc cluster create ID": "the CLI's synopsis (placeholders and [options]), not a command",
    "pip install ./shared/sdk": "installs the in-job SDK alone: "
                                "tests/unit/architecture/test_sdk_package.py builds its wheel "
                                "and installs it into a bare virtualenv",
    "import os\n\nimport numpy": "a program on the in-job SDK, not a call to the server: "
                 "tests/unit/architecture/test_sdk_package.py runs it in a bare virtualenv "
                 "holding the SDK alone",
    ".venv/bin/python bench/": "a benchmark (minutes, figures in the table below it); the "
                               "small versions run in tests (e.g. tests/unit/handlers/"
                               "test_scale_small.py)",
}


def blocks() -> list[tuple[str, str]]:
    """Every fenced block of README: (language, text)."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(README.read_text())]


def skip_reason(text: str) -> str | None:
    body = text.lstrip("\n")  # a start may span lines (two blocks open with `import os`)
    return next((why for start, why in SKIP.items() if body.startswith(start)), None)


def runnable(lang: str = "sh") -> list[str]:
    return [text for lg, text in blocks() if lg == lang and skip_reason(text) is None]


def test_every_readme_block_is_run_or_skipped_with_a_reason() -> None:
    unknown = [text.splitlines()[0] for lang, text in blocks()
               if skip_reason(text) is None and lang not in ("sh", "python")]
    assert not unknown, f"README blocks neither run nor in SKIP (add one or the other): {unknown}"
    assert runnable(), "README has no shell block left to run"
    used = {start for start in SKIP if any(skip_reason(t) == SKIP[start] for _, t in blocks())}
    assert used == set(SKIP), f"SKIP entries README no longer has: {set(SKIP) - used}"


@pytest.fixture()
def served() -> Iterator[tuple[Path, str]]:
    """``mtc serve --port P`` in a fresh directory holding README's ``examples`` (its jobs run
    ``python examples/train.py``), state in the default ``var/mtc``. The directory is one a
    user would serve from, readable by others: as root, jobs run as users of their own
    (docs/security.md) and resolve ``examples/`` in the server's directory, which pytest's
    own temporary directories (0700) would hide from them."""
    tmp_path = Path(tempfile.mkdtemp(prefix="mtc-readme-", dir="/tmp"))
    tmp_path.chmod(0o755)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTC_")}
    env["PYTHONPATH"] = str(ROOT)
    # as root, `mtc serve` would mount a file system for the jobs' outputs, which would
    # outlive the directory this test removes (tests/integration/test_tenant_jobs.py has it)
    env["MTC_JOBS_VOLUME"] = "off"
    try:
        with serve_subprocess([], [], cwd=tmp_path, env=env, log_dir=tmp_path,
                              state_dir=tmp_path / "var" / "mtc") as url:
            yield tmp_path, url
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _documents(out: str) -> list[Any]:
    """The JSON documents curl printed, one after another."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while (at := _skip_space(out, at)) < len(out):
        doc, at = decoder.raw_decode(out, at)
        docs.append(doc)
    return docs


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def test_readme_curl_and_sdk_blocks_run_as_printed(served: tuple[Path, str]) -> None:
    cwd, url = served
    [block] = runnable()  # the curl sequence; a second shell block needs its own checks
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTC_")}
    env["MTC_API"] = url
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    docs = _documents(done.stdout)
    wait, listed, cancel, job = docs
    # a cancelled job carries Vertex's CANCELLED status as its error; nothing else may
    assert not [d for d in docs[:-1] if "error" in d], docs
    assert "error" not in job or job["state"] == "JOB_STATE_CANCELLED", job
    assert wait["done"] is True and "error" not in wait, wait
    assert wait["response"]["name"].endswith("/modelDevelopmentClusters/c1"), wait
    assert all(j["state"] == "JOB_STATE_RUNNING" for j in listed.get("customJobs", [])), listed
    assert cancel == {}, cancel  # google.protobuf.Empty, as Vertex answers
    # the job was running (~1 min of steps) and the cancel took: not a 200 that changed nothing
    assert job["state"] in ("JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"), job

    # the SDK: a CustomJob on the cluster the curl block made, a training pipeline to the
    # registry and a second version, then a tuning job over examples/hp_trial.py (each block
    # uses the first's names), each to its end
    create, pipeline, tune = runnable("python")
    done = subprocess.run([sys.executable, "-c", create + pipeline + tune], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    state, piped, tuned = done.stdout.strip().splitlines()
    assert "JOB_STATE_" in state, state
    assert piped == "PIPELINE_STATE_SUCCEEDED ['1', '2']", piped + done.stderr
    assert tuned.startswith("JOB_STATE_SUCCEEDED "), tuned + done.stderr
    assert tuned.count("('") == 6, tuned  # max_trial_count=6, each with its loss
