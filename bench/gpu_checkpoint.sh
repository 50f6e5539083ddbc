#!/usr/bin/env bash
# The checkpoint benchmark (bench/checkpoint_bench.py) on CUDA, in under 5 minutes: staging into pinned host
# buffers with non-blocking copies on a side stream (staging.ReusingStager), NCCL for the training
# collectives (gloo for the checkpoint group, as rdist.init sets up), real GPU matmul steps. One GPU: W=1;
# two or more: W=2. Sizes via SIZES_MB (default 1000,2000), DCP/worker logs to $LOG.
#   bench/gpu_checkpoint.sh            # prints the table; exit status is the benchmark's
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LOG=${LOG:-${TMPDIR:-/tmp}/gpu_checkpoint.log}
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this needs a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda); sys.exit(0 if torch.cuda.is_available() else 3)'
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
worlds=1
if [ "$gpus" -ge 2 ]; then worlds=2; fi
echo "W=$worlds; logs in $LOG"
PYTHONPATH=trainer_image timeout "${TIMEOUT_S:-270}" "$PY" bench/checkpoint_bench.py \
  --device cuda --world-sizes "$worlds" --sizes-mb "${SIZES_MB:-1000,2000}" --reps 2 --steps 10 \
  --step-models cpu --compute-dim "${COMPUTE_DIM:-8192}" --threads 4 --skip-load 2>"$LOG"
