"""The goodput digital twin: the real control plane against a simulated fleet (SimPy).

- ``scenario``: scenario files (YAML), strict parsing, the defaults' constants block;
- ``failures``: the failure model calibrated to Llama 3, causes -> health signals -> true fixes;
- ``adapters``: SimClock, SimBus (Publisher), SimCompute (Compute + the analytic job model);
- ``twin``: builds the handlers through ``shared.bootstrap.build_deps`` and runs a scenario;
- ``goodput``: goodput and badput from an event log (shared with the live system);
- ``validation``: the twin against the analytic checkpointing models;
- ``report``, ``sweep``, ``cli``: ``mtc sim run`` / ``mtc sim sweep`` (also ``python -m simulator``).

See docs/simulator.md and docs/validation.md.
"""
