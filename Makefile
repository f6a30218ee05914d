# The two commands that matter: `make demo` and `make test` (`make test-fast` while you work).
# All of them set up what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)

.PHONY: demo demo-torch gpu-check test test-fast lint bench bench-stack bench-stack-load bench-slurm clean stack demo-slurm stack-slurm bench-stack-slurm

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	$(BIN)/mtc demo

# The story with a real PyTorch job: the pretrain recipe on 2 nodes x 2 ranks through an
# XID 79 and a SIGKILL of one rank; the loss curve and final weights checked against an
# uninterrupted run of the same recipe and seed.
demo-torch: $(STAMP)
	$(BIN)/mtc demo --torch

# The system tools the tests drive (Chromium and its driver, Prometheus), installed where
# missing (root), else it stops naming the command; then unit, contract and twin tests on two
# processes (they share nothing), then the integration tests on two processes (each on its
# own ports and directories; those sharing the session's Slurm cluster or emulators in one
# process: tests/integration/conftest.py), then those marked alone (the soak) one at a time;
# all run, any fails it; the first two parts name their 15 slowest tests.
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set (CI sets it): the tests start
# thousands of Python subprocesses (the CLI, servers, functions, ranks), and each compiled
# every module it imports again, a third of a command's start-up.
test: export PYTHONDONTWRITEBYTECODE=
test: $(STAMP)
	bash scripts/install_test_tools.sh
	rc=0; $(BIN)/pytest -q -p no:cacheprovider -n 2 -m "not integration" --durations=15 || rc=1; \
	$(BIN)/pytest -q -p no:cacheprovider -n 2 --dist loadgroup -m "integration and not alone" \
	  --durations=15 || rc=1; \
	$(BIN)/pytest -q -p no:cacheprovider -m "integration and alone" || rc=1; exit $$rc

# The quick loop while you work: everything but the integration and slow tests.
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: compiling every module and
# rewriting every test's asserts again on each run is most of a cold collection.
test-fast: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -n 2 -m "not integration and not slow"

# On a machine with NVIDIA GPUs: the real nvidia-smi and DCGM read by mtc's probes, the
# pretrain recipe on cuda (NCCL), a memory-tier save and restore of CUDA tensors, an
# in-process restart; under 5 minutes. Without a GPU it prints "no GPU: skipped" (docs/gpu.md).
gpu-check: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/gpu_check.sh

lint: $(STAMP)
	$(BIN)/ruff check shared simulator services tests examples
	$(BIN)/mypy shared services simulator
	$(BIN)/lint-imports --no-cache

bench: $(STAMP)
	$(BIN)/python bench/handler_bench.py

# The self-healing story on a real Slurm cluster on this host (scripts/slurm/cluster.sh; root).
demo-slurm: $(STAMP)
	$(BIN)/python -m services.cli.demo_slurm

bench-slurm: $(STAMP)
	$(BIN)/python bench/slurm_drain_bench.py

# The Google Cloud stack run locally: Pub/Sub + Firestore emulators, every function over HTTP,
# the self-healing story; stops everything it started (by PID) on exit or Ctrl-C.
stack: $(STAMP)
	$(BIN)/python scripts/stack.py

bench-stack: $(STAMP)
	$(BIN)/python bench/stack_bench.py

# agents, XID faults and API clients on the stack at once (docs/gcp.md, Load test)
bench-stack-load: $(STAMP)
	$(BIN)/python bench/stack_load.py

# The production topology here: the emulators, every function (MTC_COMPUTE=remote), the
# compute executor with SlurmCompute and a real Slurm cluster; the story with sinfo at each
# step (root: scripts/slurm/cluster.sh). Stops everything it started (by PID).
stack-slurm: $(STAMP)
	$(BIN)/python scripts/stack_slurm.py

bench-stack-slurm: $(STAMP)
	$(BIN)/python bench/stack_slurm_bench.py

# (mtc serve as root mounts its jobs' file system at var/mtc/jobs: unmounted first)
clean:
	-mountpoint -q var/mtc/jobs && umount -l var/mtc/jobs
	rm -rf var .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .grimp_cache
