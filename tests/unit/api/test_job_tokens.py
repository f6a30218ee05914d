"""A job's own credential: good for its own job, in its own project, until it expires."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from services.api.auth import authorize
from services.api.errors import ApiError
from services.api.job_tokens import JobTokens, load_key
from shared.adapters.compute.local.credentials import Credential, JobCredentials

JOB = "projects/p/locations/l/customJobs/42"


def test_a_token_names_its_job_and_expires(tmp_path: Path) -> None:
    now = [1000.0]
    tokens = JobTokens(load_key(tmp_path), now=lambda: now[0], ttl_s=60)
    token, expires = tokens.mint(JOB)
    assert expires == 1060.0
    who = tokens.authenticate(token)
    assert who is not None and who.resource == JOB and who.bindings == (("p", "job"),)
    now[0] = 1060.0
    assert tokens.authenticate(token) is None  # expired
    assert JobTokens(load_key(tmp_path)).authenticate(token.replace("ey", "ez", 1)) is None
    other_key = JobTokens(b"k" * 32, now=lambda: 1000.0)
    assert other_key.authenticate(token) is None  # another deployment's key
    assert tokens.authenticate("mtc_" + token) is None
    assert (tmp_path / "job-token.key").stat().st_mode & 0o777 == 0o600
    assert load_key(tmp_path) == load_key(tmp_path)  # made once


def test_a_job_token_reads_and_cancels_its_own_job_and_nothing_else(tmp_path: Path) -> None:
    who = JobTokens(load_key(tmp_path)).authenticate(JobTokens(load_key(tmp_path)).mint(JOB)[0])
    assert who is not None
    authorize(who, "aiplatform.customJobs.get", "p", JOB)
    authorize(who, "aiplatform.customJobs.cancel", "p", JOB + ":cancel")
    for permission, project, resource in (
            ("aiplatform.customJobs.get", "p", JOB[:-1] + "43"),
            ("aiplatform.customJobs.get", "p", JOB + "3"),
            ("aiplatform.customJobs.list", "p", "projects/p/locations/l/customJobs"),
            ("aiplatform.customJobs.get", "q", JOB.replace("/p/", "/q/")),
            ("aiplatform.customJobs.delete", "p", JOB),
            ("aiplatform.customJobs.get", "p", None)):
        with pytest.raises(ApiError):
            authorize(who, permission, project, resource)


def test_tokens_are_renewed_past_half_life_and_dropped_with_their_job(tmp_path: Path) -> None:
    now, minted = [0.0], []

    def issue(job_id: str) -> Credential:
        minted.append(job_id)
        return Credential(f"t{len(minted)}", now[0] + 100, 100, f"{JOB}-{job_id}", "http://x")

    creds = JobCredentials(tmp_path / "cred", issue, lambda: now[0])
    env = creds.env("j1")
    assert Path(env["MTC_JOB_TOKEN_FILE"]).read_text() == "t1\n"
    assert env["MTC_API"] == "http://x" and env["MTC_JOB_NAME"] == f"{JOB}-j1"
    creds.env("j2")
    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    db.execute("CREATE TABLE attempts (job_id TEXT, finalized INTEGER)")
    db.execute("INSERT INTO attempts VALUES ('j1', 0), ('j2', 1)")
    now[0] = 40.0
    creds.refresh(db)
    assert len(minted) == 2  # young: kept
    now[0] = 60.0
    creds.refresh(db)
    assert Path(env["MTC_JOB_TOKEN_FILE"]).read_text() == "t3\n"  # j1 renewed
    assert creds.directory("j2").exists()  # ended, its token not yet expired
    now[0] = 101.0
    creds.refresh(db)
    assert not creds.directory("j2").exists() and creds.directory("j1").exists()
    assert JobCredentials(tmp_path / "none", None, lambda: 0.0).env("j1") == {}
