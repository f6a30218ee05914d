"""Use-case steps that several handler services share.

A step here is what two services would otherwise each own a copy of, or reach into the other
for: starting an attempt (``gangs``), what placement and a recovery see as capacity
(``capacity``), a gang's preflight (``preflight``), the deep-check gate (``deep_checks``), idle
nodes' active checks (``active_checks``), a pool's command (``pool_commands``), a job's nodes
that need a look at a restart (``job_nodes``), a job's measured recovery costs
(``recovery_costs``) and an operator's resume of a node (``returns``). The handler services
import these and never each other (pyproject.toml's import-linter contracts); these import
``shared`` below them only.
"""
