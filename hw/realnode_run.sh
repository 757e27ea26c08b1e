#!/usr/bin/env bash
# The real node (tests/e2e/realnode.py) on a lent GPU machine with 2+ GPUs: kubelet v1.37.2, containerd
# v2.4.2 with CDI, runc, and kube-icl (nvml backend, cdi-cri) start pods that ask for GPUs; what each pod
# saw and an NCCL all-reduce inside a pod vs on the host (hw/realnode_gpu.py says what runs).
#
# The binaries do not fit one call (64 MiB a call): they travel xz-compressed in two parts, on a machine
# kept warm between the two calls.
#   here:   bash hw/realnode_run.sh pack      # .rn-bins/a (control plane), .rn-bins/b (node), from the caches
#   there:  bash hw/realnode_run.sh           # call 1, carry .rn-bins/a: unpacks into /var/tmp/icl-rn
#           bash hw/realnode_run.sh           # call 2, carry .rn-bins/b and .whl: unpacks, then runs
# (device tool, kind nvidia-h100-x2.) .whl holds the Python packages the GPU image lacks (kubernetes,
# cryptography, pytest and their own; docs/hardware.md). Files back under $OUT: realnode-log.txt
# (everything printed) and realnode-gpu.json.
set -u
cd "$(dirname "$0")/.."
STORE=${ICL_RN_STORE:-/var/tmp/icl-rn}
CONTROL=(kube-apiserver kube-scheduler etcd)
NODE=(kubelet containerd containerd-shim-runc-v2 ctr runc)

if [ "${1:-}" = pack ]; then
  set -e
  bins=$(python3 tests/e2e/build.py --bin-dir)
  node=$(python3 tests/e2e/build.py --node-dir)
  runc=$(command -v runc || echo /usr/sbin/runc)
  rm -rf .rn-bins && mkdir -p .rn-bins/a .rn-bins/b
  for f in "${CONTROL[@]}"; do xz -T2 -6 -c "$bins/$f" > ".rn-bins/a/$f.xz"; done
  for f in kubelet containerd containerd-shim-runc-v2 ctr; do xz -T2 -6 -c "$node/$f" > ".rn-bins/b/$f.xz"; done
  xz -6 -c "$runc" > .rn-bins/b/runc.xz
  cp "$node/pause.tar" .rn-bins/b/
  du -sh .rn-bins/a .rn-bins/b
  exit 0
fi

OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$STORE/bin" "$STORE/node"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
{
  echo "===== unpack ($(date +%T))"
  for part in a b; do
    for f in .rn-bins/$part/*.xz; do
      [ -e "$f" ] || continue
      name=$(basename "$f" .xz)
      case " ${CONTROL[*]} " in *" $name "*) dest=$STORE/bin ;; *) dest=$STORE/node ;; esac
      [ -x "$dest/$name" ] && continue  # unpacked by the earlier call
      xz -dc "$f" > "$dest/$name" && chmod +x "$dest/$name" && echo "$name -> $dest"
    done
  done
  [ -f .rn-bins/b/pause.tar ] && cp .rn-bins/b/pause.tar "$STORE/node/"
  missing=""
  for f in "${CONTROL[@]}"; do [ -x "$STORE/bin/$f" ] || missing="$missing $f"; done
  for f in "${NODE[@]}"; do [ -x "$STORE/node/$f" ] || missing="$missing $f"; done
  [ -f "$STORE/node/pause.tar" ] || missing="$missing pause.tar"
  if [ -n "$missing" ]; then
    echo "not yet here:$missing (the other part comes with the next call on this warm machine)"
    exit 0
  fi
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  fi
  export PYTHONPATH=/tmp/site:$PWD
  echo "===== machine ($(date +%T))"
  nvidia-smi -L
  nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version --format=csv
  uname -r; head -1 /etc/os-release
  stat -fc 'cgroup fs: %T' /sys/fs/cgroup
  "$STORE/node/kubelet" --version; "$STORE/node/containerd" --version; "$STORE/node/runc" --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
  echo "===== real node ($(date +%T))"
  ICL_E2E_BIN_DIR=$STORE/bin ICL_E2E_NODE_DIR=$STORE/node ICL_E2E_RUNC=$STORE/node/runc \
    timeout 540 python3 hw/realnode_gpu.py "$OUT/realnode-gpu.json"
  echo "realnode_gpu rc=$? ($(date +%T))"
} 2>&1 | tee -a "$OUT/realnode-log.txt"
