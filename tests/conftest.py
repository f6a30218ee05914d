"""Settings every test process shares."""

from __future__ import annotations

import os

# `mtc serve` as root puts job outputs on a loop-mounted file system of their own; tests
# start many servers in temporary directories, so only the test about it asks for one
# (the mounts would outlive the directories pytest removes)
os.environ.setdefault("MTC_JOBS_VOLUME", "off")
