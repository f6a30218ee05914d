"""The goodput digital twin: the real control plane against a simulated fleet (SimPy).

- ``scenario``: scenario files (YAML), strict parsing, the defaults' constants block;
- ``failures``: the failure model calibrated to Llama 3, causes -> health signals -> true fixes;
- ``clock``: SimClock (the Clock port on SimPy time), ``call_later``, ``EPOCH_S``;
- ``bus``: SimBus (the Publisher port: latency, duplicates, reordering, redelivery);
- ``compute``: SimCompute (the Compute port: the fleet, provisioning, repairs);
- ``world``: the simulated world's true state (nodes, jobs, attempts);
- ``jobs``: the analytic job model (attempts, checkpoints, exits, the truth ledger);
- ``failure_processes``: node faults, stragglers, planned restarts over the fleet;
- ``twin``: builds the handlers through ``services.wiring.embedded.build_deps`` and runs a scenario;
- ``goodput``: goodput and badput from an event log (shared with the live system);
- ``validation``: the twin against the analytic checkpointing models;
- ``report``, ``sweep``, ``cli``: ``mtc sim run`` / ``mtc sim sweep`` (also ``python -m simulator``).

See docs/simulator.md and docs/validation.md.
"""
