#!/usr/bin/env bash
# The demo's accelerator-ingest step on a machine with an NVIDIA GPU: the
# same testbed, but gpu0's and dpu2's lovelockd are the CUDA build (make
# lovelockd-cuda), gpu0's host agent registers the real GPU (ingest_host
# device: cuda), so
# dpu2's agent writes every input straight into device memory through the
# CUDA driver, the built-in models run as PTX kernels, and a user's Python
# model gets the slot as a torch tensor (DLPack, no copy). Every result is
# checked. It needs root, the NVIDIA driver and, for the Python step, a
# python3 with numpy, cupy and torch; not Go: build the binaries where Go
# is and carry them (docs/ingest-cuda.md, "The ingest demo on a GPU").
#
#   BIN=bin appliance/examples/ingest-cuda.sh
#
# BIN holds lovelock and lovelockd-cuda.
set -euo pipefail
cd "$(dirname "$0")/../.."

mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
source appliance/examples/demo-lib.sh

say "testbed up"
"$lovelock" testbed up --prefix "$PREFIX"

say "accelerator ingest on a GPU: client inputs through dpu2 into gpu0's GPU memory"
cat >"$RUN/dpu2.yaml" <<YAML
ingest:
  listen: "10.77.0.12:61440"
  host_listen: "10.77.12.2:61441"
  grpc: "10.77.0.12:8001"
  transport: xdp
  interfaces: [p0]
  models: [{name: checksum}, {name: mlp}, {name: affine}]
  tenants: [{id: 1, models: [checksum, mlp, affine]}, {id: 2, models: [checksum]}]
YAML
# No gpus list: the card comes from the driver's name, and the GPU's MIG
# geometry from NVML is checked against the scheduler's table at start.
cat >"$RUN/gpu0.yaml" <<YAML
ingest_host:
  listen: "10.77.12.1:61441"
  dpu: "10.77.12.2:61441"
  device: cuda
  socket: "$RUN/ingest.sock"
  models: [checksum, mlp, affine]
  worker_socket: "$RUN/ingest-workers.sock"
  external_models: [{name: affine, row_bytes: 256, out_bytes_per_row: 256}]
YAML
# Both run the CUDA build: on the testbed dpu2's agent is a process on the
# GPU's machine and maps gpu0's buffers through the CUDA driver, the
# stand-in for a BlueField's DMA engine (docs/ingest-cuda.md); the static
# lovelockd refuses CUDA handles, saying so.
BIN_LOVELOCKD=lovelockd-cuda start_node dpu2 --xdp p0
BIN_LOVELOCKD=lovelockd-cuda start_node gpu0
services_up dpu2 gpu0
wait_until gpu0 "gpu0 to register its GPU slots with dpu2 ('lovelock ingest stats' saying registered)" \
	output_has '; registered with its DPU' "$lovelock" --socket "$RUN/gpu0.sock" ingest stats
grep -E 'MIG geometry' "$RUN/gpu0.log" || { echo "gpu0 logged no MIG geometry check; its log:"; cat "$RUN/gpu0.log"; exit 1; }
"$lovelock" --socket "$RUN/gpu0.sock" ingest gpus
infer() { "$lovelock" testbed exec --prefix "$PREFIX" client -- "$lovelock" infer --dpu 10.77.0.12:61440 "$@"; }
echo "-- one checksum of 1 MiB and one MLP of 64 KiB, each checked against the CPU reference"
infer --tenant 1 --size 1MiB --check
infer --tenant 1 --model mlp --size 64KiB --check
echo "-- the same MLP through the KServe v2 gRPC front end"
infer --tenant 1 --model mlp --size 16KiB --check --grpc 10.77.0.12:8001
echo "-- a user's own model in Python: the slot as a torch tensor on the GPU (DLPack), no copy"
# torch, cupy and the CUDA context are set up before the worker attaches:
# in the first request they would take seconds, past the client's
# retransmissions (lovelock infer --retries).
PYTHONPATH=dataplane/ingest/python python3 -c '
import sys, cupy, torch, lovelock_ingest
torch.zeros(1, device="cuda")
for req in lovelock_ingest.serve("affine", socket=sys.argv[1]):
    x = req.torch("float32", (-1, 64))   # the one changed line
    req.reply(2 * x + 1)                 # the user model, unchanged
' "$RUN/ingest-workers.sock" &
pids+=($!)
wait_until gpu0 "the Python worker of affine to attach to gpu0 ('workers attached: affine 1')" \
	output_has 'workers attached: affine 1' "$lovelock" --socket "$RUN/gpu0.sock" ingest stats
python3 -c 'import numpy as np, sys; np.arange(64*64, dtype=np.float32).tofile(sys.argv[1])' "$RUN/affine.in"
infer --tenant 1 --model affine --input "$RUN/affine.in" -o json >"$RUN/affine.json"
python3 -c '
import base64, json, sys, numpy as np
out = np.frombuffer(base64.b64decode(json.load(open(sys.argv[1]))["result"]["output"]), dtype=np.float32)
x = np.arange(64*64, dtype=np.float32)
assert np.array_equal(out, 2 * x + 1), "the Python model'"'"'s output is wrong"
print("affine over 64 rows through the Python worker on the GPU: every output equals 2x+1")
' "$RUN/affine.json"
echo "-- a load: 2000 requests of 64 KiB, 16 outstanding, every output checked; host CPU per request from gpu0's lovelockd"
gpu_pid=$(pgrep -f -- "--socket $RUN/gpu0.sock" | head -1)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
before=$(cpu_ticks "$gpu_pid")
infer --tenant 1 --size 64KiB --count 2000 --concurrency 16 --check
after=$(cpu_ticks "$gpu_pid")
awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "gpu0 lovelockd CPU: %.3f s for 2000 requests = %.1f us per request (doorbell, launch, completion; the model runs on the GPU)\n", t/hz, t/hz/2000*1e6 }'
"$lovelock" --socket "$RUN/dpu2.sock" ingest stats
"$lovelock" --socket "$RUN/gpu0.sock" ingest stats
say "ok: every result checked"
