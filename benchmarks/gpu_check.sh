#!/bin/sh
# BERT-Large (sequence 128) pre-training on one GPU: plain TensorFlow
# against EPL with AMP and with AMP + gradient checkpointing, examples/s
# and MFU against NVIDIA's TF2 BERT-Large AMP figure on an A100-80GB
# (benchmarks/gpu_check.py says what each row is). About 8 minutes on one
# GPU; every row has --row_timeout seconds.
#
#   benchmarks/gpu_check.sh                        # on a GPU machine
#   EPL_GPU_CHECK_SMOKE=1 benchmarks/gpu_check.sh  # tiny BERT on CPU (CI)
#   PYTHON=.venv-latest/bin/python benchmarks/gpu_check.sh
#
# Extra arguments go to benchmarks/gpu_check.py (--batch, --steps, ...).
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
if "$PYTHON" -c 'import tensorflow as tf, sys; v = tuple(int(x) for x in tf.__version__.split(".")[:2]); sys.exit(v < (2, 16))' 2>/dev/null; then
  export TF_USE_LEGACY_KERAS=1
fi
if [ "${EPL_GPU_CHECK_SMOKE:-0}" = "1" ]; then
  export CUDA_VISIBLE_DEVICES=""
  exec "$PYTHON" benchmarks/gpu_check.py --smoke "$@"
fi
exec "$PYTHON" benchmarks/gpu_check.py "$@"
