"""The recipes' training programs: workloads that run in the job and use the in-job SDK
(``mtc_program``), launched by the recipes' CustomJobs as ``python -m
services.recipes.programs.lm`` (``.rl`` for the RL recipe). They need the ``torch`` extra;
nothing of the control plane imports them."""
