"""The recovery benchmark's data and scoring, shared by the live runner and the twin.

- :mod:`shared.resilience.trace`: a scripted fault trace (versioned YAML: fault kinds, times,
  targets), parsed strictly; errors name the field;
- :mod:`shared.resilience.score`: each incident of a run scored from its event log (time to
  detect, time to recover, steps lost, the recovery mode) and the run's goodput.

``mtc bench recovery`` (services/cli/bench_recovery.py) plays a trace against the embedded
default and the twin and prints these scores; nothing here does I/O but reading a trace file.
"""
