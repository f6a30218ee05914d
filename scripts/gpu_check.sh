#!/usr/bin/env bash
# A smoke check for a machine with NVIDIA GPUs (`make gpu-check`): the real `nvidia-smi -q -x`
# and `dcgmi diag -r 1 -j` read by mtc's probe parsers, the pretrain recipe on cuda (NCCL
# where there are two GPUs), a memory-tier save and restore of CUDA tensors, an in-process
# restart of a torch program on the GPU (scripts/gpu_check.py). Under 5 minutes.
# Where there is no GPU (no nvidia-smi, or it lists no device) it prints "no GPU: skipped"
# and exits 0. Nothing before that check runs a program outside bash: the test of the
# skip runs it with a PATH that holds nothing.
set -uo pipefail

here=${BASH_SOURCE[0]%/*}
[[ $here == "${BASH_SOURCE[0]}" ]] && here=.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "no GPU: skipped (no nvidia-smi on PATH)"
    exit 0
fi
listed=$(nvidia-smi -L 2>/dev/null)
if [[ $listed != *"GPU "* ]]; then
    echo "no GPU: skipped (nvidia-smi lists no device)"
    exit 0
fi
root=$(cd "$here/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
[[ -x $python ]] || python=python3
cd "$root" || exit 1
exec timeout 300 "$python" scripts/gpu_check.py
