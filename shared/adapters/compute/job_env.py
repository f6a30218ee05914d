"""What of the server's own environment a job gets, and the launcher's fixed environment.

The server's environment holds its secrets (``MTC_API_TOKEN``, cloud credentials, a
database URL): a job's environment is never the server's. It is built from an allow-list
of what a program needs from its machine (``PATH``, the locale, the time zone, the CA
bundles, pip's configuration, the BLAS/OpenMP/CUDA/NCCL tuning of the node), plus the names
an operator adds with ``MTC_JOB_ENV`` (comma-separated), plus the job's own ``env`` and what
the service gives a replica (``protocol.managed_env``).

The launcher (``worker_launcher``) runs with ``LAUNCHER_ENV`` and ``python -I``: when the
server is root, that process is root, so nothing of the job (``PYTHONPATH``,
``PYTHONHOME``, ``LD_PRELOAD``, ...) may reach it. The job's environment travels in a file
(``write_env_file``; NUL-separated ``NAME=value``, as ``env -0`` prints it) that the
launcher reads and hands only to the demoted child.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

PASSED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
})
PASSED_PREFIXES = ("LC_", "PIP_", "OPENBLAS_", "OMP_", "MKL_", "CUDA_", "NCCL_", "NVIDIA_")
EXTRA = "MTC_JOB_ENV"  # the operator's further names, comma-separated
LAUNCHER_ENV: Mapping[str, str] = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                                           "/sbin:/bin", "LANG": "C.UTF-8"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def passed(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """A name of the server's environment a job may see."""
    return name in PASSED or name in extra or name.startswith(PASSED_PREFIXES)


def host_env(environ: Mapping[str, str] | None = None, keep: tuple[str, ...] = ()
             ) -> dict[str, str]:
    """The part of ``environ`` (default: this process's) a job is given; ``keep``: more
    names the caller's own command needs (``SLURM_CONF`` for sbatch)."""
    environ = os.environ if environ is None else environ
    extra = frozenset(n.strip() for n in environ.get(EXTRA, "").split(",")
                      if n.strip() and not n.strip().startswith("MTC_")) | set(keep)
    return {k: v for k, v in environ.items() if passed(k, extra)}


def encode(env: Mapping[str, str]) -> bytes:
    """``env`` as ``env -0`` prints it; a name or value that cannot be one is refused."""
    out = bytearray()
    for name, value in env.items():
        if not _NAME.match(name) or "\0" in value:
            raise ValueError(f"environment variable {name!r} cannot be passed to a job")
        out += f"{name}={value}".encode() + b"\0"
    return bytes(out)


def write_env_file(path: Path, env: Mapping[str, str]) -> Path:
    """``env`` in ``path``, readable by this user only, written whole before it is named."""
    data = encode(env)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path
