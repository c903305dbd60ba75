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
ingest_dpu_yaml
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
echo "-- one checksum of 1 MiB and one MLP of 64 KiB, each checked against the CPU reference"
infer --tenant 1 --size 1MiB --check
infer --tenant 1 --model mlp --size 64KiB --check
echo "-- the same MLP through the KServe v2 gRPC front end"
infer --tenant 1 --model mlp --size 16KiB --check --grpc 10.77.0.12:8001
echo "-- a user's own model in Python: the slot as a torch tensor on the GPU (DLPack), no copy"
# The worker imports torch, as the user's model code would, before it
# attaches; lovelock_ingest opens the CUDA slots as it attaches, so the first
# request waits for neither (they take seconds, past the client's
# retransmissions).
PYTHONPATH=dataplane/ingest/python python3 -c '
import sys, torch, lovelock_ingest
for req in lovelock_ingest.serve("affine", socket=sys.argv[1]):
    x = req.torch("float32", (-1, 64))   # the one changed line
    req.reply(2 * x + 1)                 # the user model, unchanged
' "$RUN/ingest-workers.sock" &
pids+=($!)
wait_until gpu0 "the Python worker of affine to attach to gpu0 ('workers attached: affine 1')" \
	output_has 'workers attached: affine 1' "$lovelock" --socket "$RUN/gpu0.sock" ingest stats
check_affine python3 " on the GPU"
echo "-- a load: 2000 requests of 64 KiB, 16 outstanding, every output checked; host CPU per request from gpu0's lovelockd"
load_host_cpu 64KiB "doorbell, launch, waiting for the GPU, completion; the model runs on the GPU"
"$lovelock" --socket "$RUN/dpu2.sock" ingest stats
"$lovelock" --socket "$RUN/gpu0.sock" ingest stats
say "ok: every result checked"
