#!/usr/bin/env bash
# kube-icl on a lent multi-GPU machine (docs/hardware.md): steps 1-4 in one go, everything into $OUT.
#   run (kind nvidia-h100-x4, carry .whl):  bash hw/run_all.sh [LABEL]   (default: h200x4, h100x4, ...)
# Files back: log.txt, results.tar.gz (all JSON/text), probe.png, probe-mpl.png.
set -u
N=$(nvidia-smi -L | wc -l)
case "$(nvidia-smi -L | head -1)" in *H200*) CARD=h200;; *H100*) CARD=h100;; *) CARD=gpu;; esac
LABEL=${1:-${CARD}x$N}
OUT=${OUT:-/tmp/out}
R=$OUT/r
mkdir -p "$R"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
step() { echo; echo "===== $* ($(date +%T))"; }
{
step "machine"
nvidia-smi -L; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
python3 -c 'import torch, grpc, google.protobuf as p, pynvml; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "grpc", grpc.__version__, "protobuf", p.__version__)'
nproc; uname -r

step "1. nvml backend discovery vs nvidia-smi"
timeout 120 python3 hw/nvml_discover.py "$R/real-$LABEL.json" --label "$LABEL"; echo "discover rc=$?"
step "1b. tests/hw on real NVML"
ICL_HW_FIXTURE="$R/real-$LABEL.json" timeout 180 python3 -m pytest -p no:cacheprovider -q -rA --tb=short tests/hw -o addopts="" 2>&1 | tail -60

step "2. icl plugin --backend nvml under the kubelet emulator"
timeout 120 python3 hw/plugin_transcript.py "$R/plugin-transcript-$LABEL.json"; echo "plugin rc=$?"

step "3. icl probe (torch) against the nvml backend's graph"
timeout 180 python3 -m icl probe --against nvml --json "$R/probe-$LABEL.json" --png "$OUT/probe.png"; rc=$?; echo "probe rc=$rc"
if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then  # live NVML refused something: compare with the guarded recording
  timeout 180 python3 -m icl probe --against "nvml:$R/real-$LABEL.json" --json "$R/probe-$LABEL.json" --png "$OUT/probe.png"; echo "probe (recorded nvml) rc=$?"
fi
timeout 60 python3 hw/heatmap_mpl.py "$R/probe-$LABEL.json" "$OUT/probe-mpl.png" "$LABEL"; echo "mpl rc=$?"
step "3b. icl probe (cupy, smaller) against preset full:N"
timeout 120 python3 -m icl probe --engine cupy --size-mib 64 --iters 10 --against "full:$N" --json "$R/probe-cupy-$LABEL.json"; echo "probe cupy rc=$?"

step "4. NCCL all-reduce in Allocate's rank order vs other pairs"
timeout 300 python3 hw/allreduce.py "$R/plugin-transcript-$LABEL.json" "$R/real-$LABEL.json" "$R/allreduce-$LABEL.json"; echo "allreduce rc=$?"
step "done"
} 2>&1 | tee "$OUT/log.txt"
tar -czf "$OUT/results.tar.gz" -C "$R" .
rm -rf "$R"
