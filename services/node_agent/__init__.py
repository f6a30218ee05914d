"""Node agent: probes one node's health and reports it as node-problem-detector conditions.

Detecting (``xid``, ``nvidia_smi``, ``dcgm``, ``disk``, ``speed``) is kept apart from
publishing (``publish``) so every parser can be tested on recorded output, and the same
``collect`` serves the periodic agent, a one-shot check and Slurm's HealthCheckProgram.
"""
