"""Compute adapters, one package per backend, and what they share.

Every ``shared.ports.Compute`` implementation (local subprocesses, Slurm, Compute Engine, a
remote executor, the simulator's fleet) keeps the same bookkeeping rules by using
``protocol`` (what a worker is given and how it answers) and ``ledger`` (what happened, once
per key). The contract suite in ``tests/contract/test_compute_port.py`` checks each of them.

Shared, at this level:

* ``protocol``: the managed environment, exit codes (``ExitCode``), checkpoint discovery.
* ``ledger``: attempts, ranks, checkpoints and repairs, once per key; sqlite and in-memory.
* ``fact_store``: an adapter's sqlite state file and its fact outbox, a store the backend
  and its collaborators hold.
* ``worker_launcher``: runs one rank in its own session and leaves its exit code.
* ``worker_logs``: where a job's output is, page by page.

Backends: ``local`` (the embedded default), ``slurm`` (a real Slurm cluster), ``gce``
(machines from Compute Engine), ``remote`` (the port as requests to an executor).
"""
