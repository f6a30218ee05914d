"""A prebuilt image's local runtime and a job's Python packages, then the program (on the node).

    python pyenv.py --cache DIR --runtime NAME --framework MOD [--package FILE]... \\
        [--nproc-per-node N] -- (-m MODULE [ARG...] | CMD [ARG...])

mtc runs no container images (``shared.domain.images``). A pool on a prebuilt image runs this
as its command, on each node, before the program:

1. **Runtime**: ``DIR/runtime-NAME``, a virtualenv over the base interpreter whose site path
   also holds the site-packages of the Python running this file (the one mtc's workers use,
   where the framework ``MOD`` is installed: here torch 2.13 CPU). Built once, under a lock,
   into a temporary directory renamed into place; ``MOD`` must import in it.
2. **Packages** (``pythonPackageSpec.packageUris``, as local files): ``DIR/env-<hash>``, a
   virtualenv over the same interpreter whose site path adds the runtime's (what Vertex's
   ``--system-site-packages`` over the image's Python gives), with the packages installed by
   pip offline (``--no-index``, ``--no-build-isolation``: an sdist builds with the runtime's
   setuptools; a package's own dependencies must already be in the runtime). One environment
   per distinct set of package files (the hash of their contents), built once under a lock. If
   pip fails, its last lines go to stderr and into ``$MTC_TERMINATION_LOG`` and this exits 1.
3. **Program**: ``-m MODULE ARGS`` runs with the environment's Python; another command runs
   with the environment's ``bin`` first on ``PATH``. With ``--nproc-per-node`` above one it runs
   under ``torch_node`` (``torch.distributed.run`` on this node). ``exec``: the program takes
   this process's place, so the launcher's signals reach it directly.

Standard library only (run by file path).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

TORCH_NODE = Path(__file__).with_name("torch_node.py")
PIP_TAIL_LINES = 15
# the worker protocol's names (mtc_program.protocol), restated: this file runs by path
TERMINATION_LOG = "MTC_TERMINATION_LOG"
RUNTIME = "MTC_RUNTIME"


class SetupFailed(Exception):
    """The runtime or the packages could not be set up: the job fails with this message."""


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _site_dir(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def _make_venv(target: Path, site_paths: Sequence[str]) -> None:
    """A virtualenv at ``target`` over the base interpreter, ``site_paths`` on its path."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(target)], check=True,
                   capture_output=True)
    (_site_dir(target) / "_mtc_runtime.pth").write_text("".join(f"{p}\n" for p in site_paths))


def _build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """``final`` built by ``build(tmp)`` once: under a lock, in a temporary directory renamed
    into place, so a reader sees no directory or a complete one."""
    if final.is_dir():
        return final
    with _locked(final.with_name(f".{final.name}.lock")):
        if final.is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            build(tmp)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def runtime(cache: Path, name: str, framework: str) -> Path:
    """The runtime's virtualenv (step 1 of the module)."""
    frameworks = [p for p in site.getsitepackages() if Path(p).is_dir()]

    def build(tmp: Path) -> None:
        _make_venv(tmp, frameworks)
        probe = subprocess.run([str(_python(tmp)), "-c",
                                f"import {framework}; print(getattr({framework}, '__version__', ''))"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            raise SetupFailed(f"runtime {name!r}: {framework} is not installed on this machine "
                              f"({probe.stderr.strip().splitlines()[-1:]})")
        (tmp / "framework-version").write_text(probe.stdout.strip() + "\n")

    return _build_once(cache / f"runtime-{name}", build)


def packages_key(runtime_name: str, files: Sequence[Path]) -> str:
    h = hashlib.sha256(runtime_name.encode())
    for f in sorted(files, key=lambda p: p.name):
        h.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:20]


def package_env(cache: Path, rt: Path, runtime_name: str, files: Sequence[Path]) -> Path:
    """The job's environment with its packages (step 2 of the module)."""
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SetupFailed(f"package files not found: {', '.join(missing)}")
    paths = [str(_site_dir(rt)), *(_site_dir(rt) / "_mtc_runtime.pth").read_text().splitlines()]

    def build(tmp: Path) -> None:
        _make_venv(tmp, paths)
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(_python(tmp)), "install",
             "--no-index", "--no-build-isolation", "--disable-pip-version-check", "--no-input",
             *map(str, files)], capture_output=True, text=True)
        if pip.returncode != 0:
            lines = (pip.stdout + pip.stderr).strip().splitlines()[-PIP_TAIL_LINES:]
            raise SetupFailed("pip could not install the packages: " + " | ".join(lines))

    return _build_once(cache / f"env-{packages_key(runtime_name, files)}", build)


def program_argv(env: Path, command: Sequence[str], nproc: int) -> list[str]:
    """What runs (step 3): ``-m MODULE`` with the env's Python, under torch_node if nproc > 1."""
    py = str(_python(env))
    argv = [py, *command] if command[0] == "-m" else list(command)
    if nproc > 1:
        return [py, str(TORCH_NODE), "--nproc-per-node", str(nproc), "--", *argv]
    return argv


def _fail(message: str) -> int:
    print(f"pyenv: {message}", file=sys.stderr, flush=True)
    log = os.environ.get(TERMINATION_LOG)
    if log:
        with contextlib.suppress(OSError):
            Path(log).write_text(message[-2000:] + "\n")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args or args.index("--") == len(args) - 1:
        return _fail("usage: pyenv.py OPTIONS -- (-m MODULE ARGS | CMD ARGS)")
    split = args.index("--")
    parser = argparse.ArgumentParser(prog="pyenv")
    parser.add_argument("--cache", required=True, type=Path)
    parser.add_argument("--runtime", required=True)
    parser.add_argument("--framework", required=True)
    parser.add_argument("--package", action="append", default=[], type=Path)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    opts, command = parser.parse_args(args[:split]), args[split + 1:]
    try:
        rt = env = runtime(opts.cache, opts.runtime, opts.framework)
        if opts.package:
            env = package_env(opts.cache, rt, opts.runtime, opts.package)
    except SetupFailed as exc:
        return _fail(str(exc))
    except (OSError, subprocess.CalledProcessError) as exc:
        return _fail(f"could not set up runtime {opts.runtime!r}: {exc}")
    run = program_argv(env, command, opts.nproc_per_node)
    os.environ["PATH"] = f"{env / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    version = (rt / "framework-version").read_text().strip()
    os.environ[RUNTIME] = f"{opts.runtime} ({opts.framework} {version})"
    sys.stdout.flush()
    try:
        os.execvp(run[0], run)
    except OSError as exc:
        return _fail(f"cannot start {run[0]!r}: {exc}")
    return 1  # (not reached)


if __name__ == "__main__":
    sys.exit(main())
