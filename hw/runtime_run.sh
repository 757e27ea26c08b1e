#!/usr/bin/env bash
# On a lent GPU machine (2+ GPUs): the nvml backend's NVIDIA runtime strategies, for real.
#   run (one call, any kind with >= 2 GPUs, e.g. nvidia-h100-x2):  bash hw/runtime_run.sh
# Files back under $OUT: runtime-log.txt (everything printed), runtime-strategies.json (per strategy the
# whole ContainerAllocateResponse of a 2-GPU Allocate; nvidia-smi -L; the CUDA_VISIBLE_DEVICES order
# check; nvidia-container-cli / nvidia-ctk answers where installed), nvidia-smi-L.txt.
# No wheels needed: the stubs import on grpcio >= 1.60 / protobuf >= 4.25. If .whl/*.whl exist
# (e.g. a newer grpcio), they are installed first, as hw/run_all.sh does.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{
  echo "===== machine ($(date +%T))"
  nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt"
  nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version --format=csv
  python3 -c 'import grpc, google.protobuf as p; print("grpc", grpc.__version__, "protobuf", p.__version__)'
  python3 -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))'
  python3 -c 'import torch; print("torch", torch.__version__, "cuda devices", torch.cuda.device_count())' || echo "no torch: the CUDA order check is skipped"
  command -v nvidia-container-cli nvidia-ctk || echo "no NVIDIA container toolkit on this machine"
  echo "===== strategies ($(date +%T))"
  timeout 400 python3 hw/runtime_strategies.py "$OUT/runtime-strategies.json"
  echo "runtime_strategies rc=$?"
} 2>&1 | tee "$OUT/runtime-log.txt"
