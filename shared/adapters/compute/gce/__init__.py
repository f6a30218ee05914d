"""Machines from Compute Engine.

``compute`` (machine lifecycle, ``GceCompute``), ``api`` (the REST calls and their errors),
``maintenance`` (host maintenance events as health reports), ``split`` (the port: machines
from Compute Engine, workers from Slurm or local processes), ``power`` (Slurm's
Resume/SuspendProgram on Compute Engine).
"""
