"""The environment variables of the checkpoint tiers, one definition for the adapters that
set them (``shared.adapters.compute.protocol.managed_env``) and the program that reads them
(``shared.program.tiers``). Standard library only: the adapters import it.

* ``MTC_TIER1_DIR``: this rank's directory in its node's memory (tmpfs: ``/dev/shm``).
* ``MTC_TIER2_DIR``: where this rank's peer copy goes: a directory on its buddy's node
  (the node of rank ``(rank + 1) % world``), so one node's loss never takes both copies.
* ``MTC_TIER2_SOURCE_DIR``: where the peer copy of this rank's state made in the previous
  attempt can be read back (its previous buddy's directory; the same as ``MTC_TIER2_DIR``
  when the placement did not change).
* ``MTC_TIER1_EVERY``, ``MTC_TIER2_EVERY``, ``MTC_TIER3_EVERY``: steps between saves of
  each tier (the job's own choice, through its environment; the program has defaults).
* ``MTC_TIER_KEEP``: entries kept per rank on tiers 1 and 2, ``MTC_TIER3_KEEP`` on the
  durable tier (retention).
* ``MTC_PROGRESS_INTERVAL_S``: the least seconds between two heartbeats (default 5).
* ``MTC_RESTORE_TIMEOUT_S``: how long a rank waits for the others' restorable steps.
* ``MTC_PROGRESS_FILE``: the rank's heartbeat (JSON: step, time, newest step per tier, the
  last save's tier and blocking seconds), rewritten at a bounded rate; with per-rank
  progress (``shared.program.progress``) also compute and wait seconds, the newest steps'
  timings and the collective last entered or left with its sequence number (docs/hangs.md).
"""

from __future__ import annotations

TIER1_DIR = "MTC_TIER1_DIR"
TIER2_DIR = "MTC_TIER2_DIR"
TIER2_SOURCE_DIR = "MTC_TIER2_SOURCE_DIR"
TIER1_EVERY = "MTC_TIER1_EVERY"
TIER2_EVERY = "MTC_TIER2_EVERY"
TIER3_EVERY = "MTC_TIER3_EVERY"
TIER_KEEP = "MTC_TIER_KEEP"
TIER3_KEEP = "MTC_TIER3_KEEP"
RESTORE_TIMEOUT_S = "MTC_RESTORE_TIMEOUT_S"
PROGRESS_INTERVAL_S = "MTC_PROGRESS_INTERVAL_S"
PROGRESS_FILE = "MTC_PROGRESS_FILE"
DIR_VARS = (TIER1_DIR, TIER2_DIR, TIER2_SOURCE_DIR, PROGRESS_FILE)  # what an adapter sets

# The tiers by name, as ``JobCheckpointSaved.tier`` and the recovery policy's ``Tier`` spell them.
MEMORY, PEER, DURABLE = "memory", "peer", "durable"

# The layout under a node's memory root (``<root>/<job>/...``): a rank's own entries and the
# peer copies this node holds for the ranks whose buddy it is.
PROGRESS_NAME = "progress.json"


def rank_dir(rank: int) -> str:
    return f"rank-{rank}"


def peer_dir(rank: int) -> str:
    return f"peer/rank-{rank}"
