"""mtc's in-job SDK: what a training program may import to run well under mtc (or under any
service that speaks the same worker protocol). Its core needs the standard library and numpy;
the ``torch_*`` modules need the ``torch`` extra. Nothing here imports mtc's control plane:
the control plane imports ``protocol`` from here.

* ``protocol``: the worker protocol's one definition (environment names, exit codes,
  checkpoint names and layout);
* ``env``: the managed environment, read and checked; ``signals``: SIGTERM as a flag;
* ``tiers`` (with ``entries`` and ``cut``): checkpoints in node memory, on a peer node and on
  durable storage, restored from the newest step every rank holds;
* ``progress``: per-rank heartbeats (step, compute and wait, the collective in flight);
* ``inprocess``: in-process restart and warm standbys;
* ``scalars``: TensorBoard scalars continuous across restarts;
* ``torch_checkpoint``, ``torch_tiers``, ``torch_runtime``: the same for PyTorch programs.

Importing the package imports none of its modules.
"""

__version__ = "0.1.0"
