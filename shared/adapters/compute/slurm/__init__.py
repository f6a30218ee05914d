"""The Compute port over a real Slurm cluster, by composition.

``compute`` (the port, ``SlurmCompute``) holds one collaborator per concern, each built with
the frozen ``SlurmSettings`` and the shared pieces it needs: ``ops`` (the keyed, retried
operation queue), ``agents`` (the node agents), ``drains`` (whose drain it is), ``nodes``
(mapping, cordons, repairs, provisioning), ``attempts`` (attempts as batch jobs),
``userjobs`` (jobs users submit with plain ``sbatch``) and ``deep_checks`` (maintenance
reservations). Below them: ``cli`` (typed Slurm commands), ``api`` (what is read from and
asked of Slurm), ``scripts`` (the batch scripts), ``settings`` and ``view`` (the last
observation of Slurm, shared by the collaborators).
"""
