"""Compute adapters and what they share: the worker protocol and the attempt/repair ledger.

Every ``shared.ports.Compute`` implementation (local subprocesses, Slurm, the simulator's
fleet, the ones later issues add) keeps the same bookkeeping rules by using ``protocol`` (what
a worker is given and how it answers) and ``ledger`` (what happened, once per key). The
contract suite in ``tests/contract/test_compute_port.py`` checks each of them.

* ``protocol``: the managed environment, exit codes (``ExitCode``), checkpoint discovery.
* ``ledger``: attempts, ranks, checkpoints and repairs, once per key; sqlite and in-memory.
* ``fact_state``: an adapter's sqlite state file and its fact outbox.
* ``worker_launcher``: runs one rank in its own session and leaves its exit code.
* ``local_compute`` (the port), ``local_nodes``, ``local_faults``, ``local_procs``: the
  embedded default's simulated nodes and real worker processes.
* ``slurm_compute`` (the port), ``slurm_api``, ``slurm_cli``, ``slurm_ops``, ``slurm_agents``,
  ``slurm_nodes``, ``slurm_scripts``, ``slurm_attempts``: a real Slurm cluster.
* ``gce_compute`` (machine lifecycle on Compute Engine), ``gce_api``, ``gce_maintenance``,
  ``gce_split`` (the port: machines from Compute Engine, workers from Slurm or local
  processes), ``gce_power`` (Slurm's Resume/SuspendProgram on Compute Engine).
"""
