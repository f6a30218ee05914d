"""Compute adapters and what they share: the worker protocol and the attempt/repair ledger.

Every ``shared.ports.Compute`` implementation (local subprocesses, Slurm, the simulator's
fleet, the ones later issues add) keeps the same bookkeeping rules by using ``protocol`` (what
a worker is given and how it answers) and ``ledger`` (what happened once per key). The
contract suite in ``tests/contract/test_compute_port.py`` checks each of them.
"""
