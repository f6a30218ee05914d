#!/bin/bash
# A job you submit yourself with plain sbatch, in a partition mtc manages, that mtc heals:
#
#   sbatch examples/slurm_user_job.sh --steps 400 --checkpoint-every 20
#
# When a node under it fails, mtc drains the node, sends the program SIGTERM
# (scancel --signal=TERM), waits the grace period, requeues the job (scontrol requeue) and
# Slurm runs it again on a healthy node; the program resumes from its newest checkpoint. The
# three lines that make that work are marked (1), (2), (3); docs/slurm.md explains them.
#SBATCH --job-name=user-train
#SBATCH --partition=mtc
#SBATCH --nodes=1
#SBATCH --open-mode=append
#SBATCH --requeue
# (1) above: Slurm may run the job again after mtc requeues it.
#SBATCH --comment=mtc:checkpoint-dir=checkpoints
# (2) above: where the program writes its ckpt-<step> files (relative to the submit dir), so
#     mtc sees its checkpoints (job view, lost work, goodput).
set -u
run=$((${SLURM_RESTART_COUNT:-0} + 1))
echo "run ${run} of Slurm job ${SLURM_JOB_ID} on ${SLURMD_NODENAME:-?}"
export AIP_CHECKPOINT_DIR="${SLURM_SUBMIT_DIR}/checkpoints" AIP_MODEL_DIR="${SLURM_SUBMIT_DIR}/model"
# (3) the program runs as a job step (srun): the SIGTERM goes to job steps. It saves a
#     checkpoint and exits 75 on SIGTERM, and on every run resumes from the newest checkpoint
#     in AIP_CHECKPOINT_DIR (SLURM_RESTART_COUNT says which run this is).
srun "${PYTHON:-python3}" "${TRAIN_SCRIPT:-${SLURM_SUBMIT_DIR}/train.py}" "$@"
