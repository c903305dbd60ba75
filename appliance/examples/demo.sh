#!/usr/bin/env bash
# The testbed demo (make demo): a small Lovelock cluster in network
# namespaces. It brings the testbed up, starts lovelockd on dpu0 and dpu1
# (with the messaging agents on AF_XDP), applies the example rule set, sends
# mixed traffic from host0 into dpu0 and checks each class at its rule's
# counter and at its destination, runs Histogram between host0 and host1
# through the DPUs' agents, maps far
# memory on mem0 from host1 through dpu1 and checks every byte, sends
# inference inputs from client through dpu2 into gpu0's (shared-memory) GPU
# slots and checks every result, runs the planner on the paper's scenarios, and tears everything down again (also
# when a step fails).
set -euo pipefail
cd "$(dirname "$0")/../.."

source appliance/examples/demo-lib.sh

say "testbed up: hosts, DPUs, a memory node, a GPU host and a client, as network namespaces"
"$lovelock" testbed up --prefix "$PREFIX"
"$lovelock" testbed status --prefix "$PREFIX"

say "host0 reaches host1 through dpu0, the fabric and dpu1"
"$lovelock" testbed exec --prefix "$PREFIX" host0 -- ping -c 2 -W 1 10.77.11.1

echo '{}' >"$RUN/dpu0.yaml"
# dpu1 also runs the far-memory agent for host1 (the far-memory step below).
# Its 4 MiB dynamic cache serves the graph step's edge reads; regions stay out of it unless
# their program asks (prefetcher off by default), so the bench-mem step below is uncached.
echo 'far_memory: {listen: "10.77.0.11:61440", servers: [{addr: "10.77.0.20:61440"}], cache: {size: 4MiB, prefetcher: off}}' >"$RUN/dpu1.yaml"
for dpu in dpu0 dpu1; do
	say "lovelockd on $dpu: XDP on pf0hpf (from the host) and p0 (from the fabric); the messaging agent on AF_XDP"
	start_node "$dpu" --xdp pf0hpf --xdp p0 \
		--msg-cluster appliance/examples/cluster.yaml --msg-node "$dpu" \
		--msg-transport xdp --msg-iface pf0hpf --msg-iface p0
done
for dpu in dpu0 dpu1; do
	for _ in $(seq 100); do
		"$lovelock" --socket "$RUN/$dpu.sock" iface list >/dev/null 2>&1 && break
		sleep 0.1
	done || true
	if ! "$lovelock" --socket "$RUN/$dpu.sock" iface list >/dev/null 2>&1; then
		echo "lovelockd on $dpu did not come up; its log:"
		cat "$RUN/$dpu.log"
		exit 1
	fi
	"$lovelock" --socket "$RUN/$dpu.sock" iface list
done

# Ready means everything asked for runs: attachments on the live
# interfaces, rules, services (lovelock status exits 1 otherwise).
node_ok status "lovelockd runs degraded" dpu0 dpu1

for dpu in dpu0 dpu1; do
	# The agents start beside the API; wait until messaging runs on its AF_XDP sockets.
	wait_until "$dpu" "messaging on $dpu ('lovelock msg stats')" "$lovelock" --socket "$RUN/$dpu.sock" msg stats
done

say "apply the example rule set to dpu0 (appliance/examples/rules.yaml), beside lovelockd's own messaging rules"
"$lovelock" --socket "$RUN/dpu0.sock" rules apply -f appliance/examples/rules.yaml
"$lovelock" --socket "$RUN/dpu0.sock" rules

say "host0 sends mixed traffic into dpu0 and checks each class where its rule sends it"
# Service packets, plain IP and garbage, addressed to dpu0. --check captures
# at every destination while it sends (dpu0's stack, the fabric's end of p0,
# host0's end of pf0hpf), reads dpu0's live rules and counters, and fails the
# demo unless every class was counted by the rule appliance/examples/
# traffic-check.yaml names and arrived where it says: passed classes in
# dpu0's kernel, redirected ones on the fabric (the testbed runs xdp_pass
# there, as veth needs to deliver them; docs/testbed.md), dropped ones
# nowhere.
"$lovelock" --socket "$RUN/dpu0.sock" testbed traffic --prefix "$PREFIX" --count 20 \
	--check appliance/examples/traffic-check.yaml host0

say "per-rule and per-verdict counters on dpu0"
"$lovelock" --socket "$RUN/dpu0.sock" stats

say "messaging (Buddy): Histogram on host0 and host1, small messages aggregated by lovelockd's agents on dpu0 and dpu1"
# The clients of appliance/examples/cluster.yaml run on host0 and host1; the
# agents are lovelockd's, receiving on AF_XDP sockets on pf0hpf and p0.
"$BIN/bench-msg" -demo -cluster appliance/examples/cluster.yaml -prefix "$PREFIX" -inserts 200000

say "dpu0's agent: per next hop, and per transport path (xsk: AF_XDP sockets; kernel: what XDP passed to the stack)"
"$lovelock" --socket "$RUN/dpu0.sock" msg stats
echo "(The drops are the mixed traffic sent earlier to the agent's port: other tenants' and malformed packets.)"

say "far memory (SODA): lovelockd as memory server on mem0, far-memory agent on dpu1, host agent on host1"
# dpu1's lovelockd runs the far-memory agent beside its messaging agent
# (its config, written above); host1's programs map regions of mem0 through it.
cat >"$RUN/mem0.yaml" <<YAML
memory_server: {addr: "10.77.0.20:61440", state_dir: "$RUN/mem0-state", capacity: 1GiB}
YAML
cat >"$RUN/host1.yaml" <<YAML
far_memory_host: {agent: "10.77.0.11:61440", socket: "$RUN/farmem.sock"}
YAML
for node in mem0 host1; do start_node "$node"; done
services_up mem0 dpu1 host1
"$lovelock" testbed exec --prefix "$PREFIX" host1 -- "$BIN/bench-mem" -demo \
	-mem-socket "$RUN/mem0.sock" -dpu-socket "$RUN/dpu1.sock" -host-socket "$RUN/farmem.sock"

say "graph analytics over far memory: PageRank on host1, its CSR on mem0, the edges through dpu1's dynamic cache"
# The graph (scale 16: 9 MiB) is preloaded by mem0 into a region, mapped on
# host1 with a buffer of a third of it, and its edge arrays are served by
# dpu1's dynamic edge cache with SODA's prefetcher; the run is checked
# against the same app in memory (graph run fails otherwise).
"$lovelock" graph gen --scale 16 --out "$RUN/g.csr"
"$lovelock" testbed exec --prefix "$PREFIX" host1 -- "$lovelock" graph run --app pagerank --graph "$RUN/g.csr" \
	--host-socket "$RUN/farmem.sock" --mem-socket "$RUN/mem0.sock" --dpu-socket "$RUN/dpu1.sock" --cache dynamic

say "far memory: mem0's memory server and dpu1's agent"
"$lovelock" --socket "$RUN/mem0.sock" mem stats
"$lovelock" --socket "$RUN/dpu1.sock" mem stats

say "accelerator ingest (Conspirator): clients send inputs to dpu2, which writes them straight into gpu0's (shared-memory) GPU slots"
# dpu2's lovelockd runs the ingest agent on an AF_XDP socket on p0 and a
# KServe v2 gRPC front end; gpu0's runs the GPU host agent with two
# shared-memory GPUs standing in for an H100 and an A100 (docs/ingest.md).
ingest_dpu_yaml
cat >"$RUN/gpu0.yaml" <<YAML
ingest_host:
  listen: "10.77.12.1:61441"
  dpu: "10.77.12.2:61441"
  device: shm
  gpus: [{card: H100-80GB}, {card: A100-40GB}]
  socket: "$RUN/ingest.sock"
  models: [checksum, mlp, affine]
  # affine is the user's own model: a Python worker serves it (below).
  worker_socket: "$RUN/ingest-workers.sock"
  external_models: [{name: affine, row_bytes: 256, out_bytes_per_row: 256}]
YAML
start_node dpu2 --xdp p0
start_node gpu0
services_up dpu2 gpu0
# The host registers its slot buffers with the DPU (heartbeat, handle socket).
wait_until gpu0 "gpu0 to register its GPU slots with dpu2 ('lovelock ingest stats' saying registered)" \
	output_has '; registered with its DPU' "$lovelock" --socket "$RUN/gpu0.sock" ingest stats
"$lovelock" --socket "$RUN/gpu0.sock" ingest gpus
"$lovelock" --socket "$RUN/dpu2.sock" ingest models
echo "-- one 1 MiB input, checksummed where it landed on the GPU side; --check compares with the client's own"
infer --tenant 1 --size 1MiB --check
echo "-- the MLP on 256 rows, checked against its CPU reference"
infer --tenant 1 --model mlp --size 64KiB --check
echo "-- the same through the KServe v2 gRPC front end (ModelInfer), as a Triton client sends it"
infer --tenant 1 --model mlp --size 16KiB --check --grpc 10.77.0.12:8001
echo "-- a user's own model in Python: the worker's one changed line views the bytes dpu2 wrote as a NumPy array, no copy"
PYTHONPATH=dataplane/ingest/python /usr/bin/python3 -c '
import sys, numpy as np, lovelock_ingest
for req in lovelock_ingest.serve("affine", socket=sys.argv[1]):
    x = req.numpy(np.float32, (-1, 64))   # the one changed line
    req.reply(2 * x + 1)                  # the user model, unchanged
' "$RUN/ingest-workers.sock" &
pids+=($!)
wait_until gpu0 "the Python worker of affine to attach to gpu0 ('workers attached: affine 1')" \
	output_has 'workers attached: affine 1' "$lovelock" --socket "$RUN/gpu0.sock" ingest stats
check_affine /usr/bin/python3 ""
echo "-- tenant 2 is not granted the MLP: refused, and nothing else harmed"
# Refused means dpu2 answered not-granted: any other failure (dpu2 gone, a
# wrong flag) is not the refusal this step shows.
if infer --tenant 2 --model mlp --size 4KiB >"$RUN/refused.out" 2>&1; then
	cat "$RUN/refused.out"
	echo "tenant 2 ran a model it was not granted"
	exit 1
fi
cat "$RUN/refused.out"
if ! grep -q '^error: *not-granted: tenant 2 ' "$RUN/refused.out"; then
	echo "tenant 2's request failed, but was not refused as not granted (above)"
	exit 1
fi
echo "-- a load: 2000 requests of 4 KiB, 16 outstanding, every output checked; host CPU per request from gpu0's lovelockd"
load_host_cpu 4KiB "doorbell, launch, completion; the shm device runs the model on this CPU too"
"$lovelock" --socket "$RUN/dpu2.sock" ingest stats
"$lovelock" --socket "$RUN/gpu0.sock" ingest stats

say "the cost and energy model of SmartNIC-hosted clusters (the Lovelock paper)"
"$lovelock" plan --scenario paper
"$lovelock" plan --phi 3 --slowdown 1.2
