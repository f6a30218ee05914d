"""Programs mtc runs on the nodes before a job's own (standard library only, run by path):
``pyenv`` sets up a prebuilt image's runtime and a job's packages, ``torch_node`` runs several
processes per node under ``torch.distributed.run``. The handlers name them in the commands
they give a gang; the adapters run those commands unchanged (under ``worker_launcher``)."""

from pathlib import Path

PYENV = Path(__file__).with_name("pyenv.py")
TORCH_NODE = Path(__file__).with_name("torch_node.py")
