"""The embedded default: simulated nodes in a state file, real worker processes.

``compute`` (the port, ``LocalCompute``), ``nodes`` (the simulated machines and their
faults' bookkeeping), ``faults`` (which injected fault wants which repair), ``procs`` (the
worker processes and their exit files).
"""
