# The testbed demos' shared part, sourced by demo.sh (make demo) and
# ingest-cuda.sh from the repository's root: the run directory, starting
# lovelockd in a node, waiting for services and conditions, and the cleanup
# that stops everything and takes the testbed down, also when a step fails.
# It expects BIN (binaries, default bin) and PREFIX (the testbed's prefix,
# default ll-) and sets RUN, lovelock and pids.

BIN=${BIN:-bin}
PREFIX=${PREFIX:-ll-}
RUN=$(mktemp -d /tmp/lovelock-demo.XXXXXX)
lovelock="$BIN/lovelock"
pids=()

say() { if [ -t 1 ]; then printf '\n\033[1m== %s\033[0m\n' "$*"; else printf '\n== %s\n' "$*"; fi; }

# start_node NODE [FLAGS...] runs $BIN/lovelockd (or $BIN/$BIN_LOVELOCKD) in
# NODE with $RUN/NODE.yaml; each daemon locks its pin directory's parent, so
# one parent per node.
start_node() {
	local node=$1
	shift
	mkdir -p "/sys/fs/bpf/lovelock-demo-$node"
	"$lovelock" testbed exec --prefix "$PREFIX" "$node" -- "$BIN/${BIN_LOVELOCKD:-lovelockd}" \
		--config "$RUN/$node.yaml" --pin-dir "/sys/fs/bpf/lovelock-demo-$node/lovelock" \
		--state "$RUN/$node.state.json" --socket "$RUN/$node.sock" --metrics off "$@" >"$RUN/$node.log" 2>&1 &
	pids+=($!)
}

# node_ok SUBCOMMAND WHAT NODE... retries 'lovelock SUBCOMMAND' on each node
# for up to 10 s until it exits 0, then runs it once more to show its
# output; if it still fails, the demo fails saying "WHAT on NODE", with the
# node's log.
node_ok() {
	local sub=$1 what=$2 node
	shift 2
	for node in "$@"; do
		for _ in $(seq 100); do
			"$lovelock" --socket "$RUN/$node.sock" "$sub" >/dev/null 2>&1 && break
			sleep 0.1
		done
		if ! "$lovelock" --socket "$RUN/$node.sock" "$sub"; then
			echo "$what on $node; its log:"
			cat "$RUN/$node.log"
			exit 1
		fi
	done
}

# services_up NODE... waits until every service of each node runs (lovelock
# services exits non-zero until then).
services_up() { node_ok services "a service is not running" "$@"; }

# wait_until NODE WHAT COMMAND [ARG...] retries COMMAND for up to 10 s until it
# succeeds; if it never does, it fails the demo, saying what it waited for,
# with NODE's log.
wait_until() {
	local node=$1 what=$2
	shift 2
	for _ in $(seq 100); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "timed out after 10 s waiting for $what; $node's log:"
	cat "$RUN/$node.log"
	exit 1
}

# output_has PATTERN COMMAND [ARG...] succeeds when COMMAND succeeds and its
# output contains PATTERN (no grep -q in a pipe: with pipefail, the
# command's SIGPIPE would fail a match).
output_has() {
	local pattern=$1 out
	shift
	out=$("$@") && [[ $out == *"$pattern"* ]]
}

cleanup() {
	local rc=$?
	# Last started first, each waited for: the Python worker goes before
	# the lovelockd it is attached to (else it reports the closed socket).
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	# Removing the pins detaches the programs: the demo leaves nothing behind.
	# What is left anyway fails the demo, said, rather than stay unnoticed.
	rm -rf /sys/fs/bpf/lovelock-demo-* 2>/dev/null || true
	if compgen -G '/sys/fs/bpf/lovelock-demo-*' >/dev/null; then
		echo "pins left behind (remove them by hand):" /sys/fs/bpf/lovelock-demo-*
		rc=1
	fi
	if ! "$lovelock" testbed down --prefix "$PREFIX" >"$RUN/down.log" 2>&1; then
		echo "testbed down failed, namespaces or veths may be left; run '$lovelock testbed down --prefix $PREFIX' again:"
		cat "$RUN/down.log"
		rc=1
	fi
	rm -rf "$RUN"
	exit "$rc"
}
trap cleanup EXIT

# The ingest step's shared parts (demo.sh and ingest-cuda.sh).

# ingest_dpu_yaml writes dpu2's config: the ingest agent on an AF_XDP socket
# on p0 and a KServe v2 gRPC front end.
ingest_dpu_yaml() {
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
}

# infer ARGS... runs lovelock infer from the client node against dpu2.
infer() { "$lovelock" testbed exec --prefix "$PREFIX" client -- "$lovelock" infer --dpu 10.77.0.12:61440 "$@"; }

# check_affine PYTHON WHERE sends 64 rows of 64 floats to the affine model
# (a Python worker's) and checks that every output is 2x+1, with PYTHON (a
# python3 with NumPy).
check_affine() {
	local python=$1 where=$2
	"$python" -c 'import numpy as np, sys; np.arange(64*64, dtype=np.float32).tofile(sys.argv[1])' "$RUN/affine.in"
	infer --tenant 1 --model affine --input "$RUN/affine.in" -o json >"$RUN/affine.json"
	"$python" -c '
import base64, json, sys, numpy as np
out = np.frombuffer(base64.b64decode(json.load(open(sys.argv[1]))["result"]["output"]), dtype=np.float32)
x = np.arange(64*64, dtype=np.float32)
assert np.array_equal(out, 2 * x + 1), "the Python model'"'"'s output is wrong"
print("affine over 64 rows through the Python worker" + sys.argv[2] + ": every output equals 2x+1")
' "$RUN/affine.json" "$where"
}

# load_host_cpu SIZE NOTE sends 2000 requests of SIZE, 16 outstanding, every
# output checked, and prints gpu0's lovelockd CPU time per request.
load_host_cpu() {
	local size=$1 note=$2 pid before after
	pid=$(pgrep -f -- "--socket $RUN/gpu0.sock" | head -1)
	before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
	infer --tenant 1 --size "$size" --count 2000 --concurrency 16 --check
	after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
	awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v note="$note" \
		'BEGIN { printf "gpu0 lovelockd CPU: %.3f s for 2000 requests = %.1f us per request (%s)\n", t/hz, t/hz/2000*1e6, note }'
}
