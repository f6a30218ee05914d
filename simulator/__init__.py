"""The goodput digital twin: the real control plane against a simulated fleet (SimPy).

- ``scenario``: scenario files (YAML): strict parsing and loading; ``overrides``: what
  ``--set`` and a sweep's axes change in one;
- ``scenario_types``: the defaults' constants block and the parsed scenario (dataclasses);
- ``readers``: the shared validation kit for scenarios (ScenarioError), durations, ``Dist``;
- ``failures``: the failure model calibrated to Llama 3, causes -> health signals -> true fixes;
- ``failure_config``: the scenario's ``failures`` section, parsed into the model's config;
- ``clock``: SimClock (the Clock port on SimPy time), ``call_later``, ``EPOCH_S``;
- ``bus``: SimBus (the Publisher port: latency, duplicates, reordering, redelivery);
- ``compute``: SimCompute (the Compute port, by delegation to the collaborators below);
- ``fleet``: the one fleet the collaborators hold (environment, scenario, bus, nodes, jobs,
  indices, timeline);
- ``world``: the simulated world's true state (nodes, jobs, attempts);
- ``agent``, ``machines``, ``launches``: the nodes' agents, provisioning and repairs, a new
  attempt seated on its nodes;
- ``jobs``, ``progress``, ``tiers``: the analytic job model (attempts, checkpoints, exits, the
  truth ledger), an attempt's progress in numbers, a tiered job's stops;
- ``failure_processes``, ``stragglers``, ``slow_in_job``: node faults, hangs and planned
  restarts; stragglers and each attempt's pace; slow ranks as a job sees them;
- ``twin``: builds the handlers through ``services.wiring.embedded.build_deps`` and runs a scenario;
- ``goodput``: goodput and badput from an event log: ``shared.goodput``, the live system's;
- ``replay``, ``fit`` (with ``fitted``: what a fit says), ``spares``: what-ifs from a
  recorded history (``mtc replay``, ``mtc sim fit``, ``mtc sim plan-spares``);
- ``stats``: means and confidence intervals over replications;
- ``validation``: the twin against the analytic checkpointing models;
- ``report``, ``sweep``, ``cli``: ``mtc sim run`` / ``mtc sim sweep`` (also ``python -m simulator``).

See docs/simulator.md and docs/validation.md.
"""
