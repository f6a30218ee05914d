"""Node health probes: detecting (tool outputs into conditions), never remedying.

The node agent service (``services/node_agent``) runs them on a node and publishes the
report; compute adapters that own a node's lifecycle (Slurm) run them after a repair.
"""
