# Lovelock — the entry points people type. `make help` lists them.
#
# Two commands work on a fresh Debian bookworm machine, as root:
#   make demo   sets up everything and runs the testbed demo
#   make test   sets up everything and runs the test suite

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# Go lives in /usr/local/go on our machines; the module proxy supplies the
# toolchain go.mod asks for when the installed one is older.
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)
export GOTOOLCHAIN ?= auto

GO        ?= go
BIN       := bin
ARCHES    := amd64 arm64
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/lovelock-dpu/lovelock/control/buildinfo.Version=$(VERSION)
# Fuzz budgets are execution counts, not durations: a duration races Go's fuzz
# coordinator at the deadline (go.dev/issue/75804, fixed in Go 1.27) and fails
# spuriously with "context deadline exceeded" on a loaded machine.
FUZZTIME  ?= 100000x
PREFIX    ?= ll-
# Go release installed when a machine has none (see deps).
GO_BOOTSTRAP := go1.26.8

# Debian packages the project needs: clang/llvm/libbpf-dev/linux-libc-dev
# build the BPF objects; iproute2, bpftool and tcpdump are for people
# inspecting the testbed; git and ca-certificates fetch Go modules;
# coinor-cbc is the MILP solver the scheduler's exact solver is checked against;
# python3-numpy (with python3) runs the ingest Python hand-off's worker in tests.
APT_PACKAGES := clang llvm libbpf-dev linux-libc-dev iproute2 bpftool tcpdump \
	iputils-ping git make ca-certificates coinor-cbc python3-numpy

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## install every apt package and Go module the project needs (idempotent)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "deps: installing $$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@if ! command -v $(GO) >/dev/null; then \
		echo "deps: no Go found; bootstrapping $(GO_BOOTSTRAP) into /usr/local/go through Debian's golang-go and the module proxy"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null; \
		arch=$$(dpkg --print-architecture); \
		dir=$$(cd /tmp && GOMODCACHE=/usr/local/lib/go-toolchains GOFLAGS=-modcacherw /usr/lib/go/bin/go mod download -json \
			golang.org/toolchain@v0.0.1-$(GO_BOOTSTRAP).linux-$$arch | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'); \
		[ ! -e /usr/local/go ] || { echo "deps: /usr/local/go exists but holds no go binary; remove it and rerun"; exit 1; }; \
		ln -s "$$dir" /usr/local/go; \
	fi
	@$(GO) mod download
	@$(GO) version

.PHONY: generate
generate: ## regenerate the BPF objects and Go bindings from bpf/*.c and the CUDA kernels' PTX (needs clang)
	$(GO) generate ./bpf/... ./dataplane/ingest/devmem/cuda/

.PHONY: build
build: ## build static lovelock and lovelockd for amd64 and arm64 into bin/
	@for arch in $(ARCHES); do \
		for cmd in control/cmd/lovelock appliance/cmd/lovelockd; do \
			CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' \
				-o $(BIN)/linux_$$arch/$$(basename $$cmd) ./$$cmd; \
		done; \
	done
	@ls -l $(BIN)/linux_*/

# Packages with goroutines and atomics of their own: `make test` runs their
# tests again under the race detector.
RACE_PKGS := ./appliance/service/... ./control/api/ ./control/testbed/ ./dataplane/messaging/... \
	./dataplane/farmem/ ./dataplane/farmem/fmap/ ./dataplane/ingest/agent/ ./dataplane/ingest/hostagent/ ./dataplane/ingest/client/ ./dataplane/ingest/kserve/ \
	./dataplane/transport/... ./dataplane/xsk/
# Fuzz targets whose executions are costly get a smaller budget:
# FuzzClassify runs every input through the BPF program in the kernel.
FUZZ_BUDGETS := FuzzClassify=20000x

.PHONY: test
# TEST_TIMEOUT bounds one package's tests: lovelockd's end-to-end package
# restarts the daemon (and the verifier's load) dozens of times, about 5
# minutes on a 2-core machine, near go test's default of 10.
TEST_TIMEOUT ?= 25m

test: deps ## run every test (privileged ones need root), the race detector over the concurrent packages, and every fuzz target
	$(GO) tool gotestsum --format testname -- -count=1 -timeout $(TEST_TIMEOUT) ./...
	GOTESTSUM_JSONFILE=$${GOTESTSUM_JSONFILE:+$$GOTESTSUM_JSONFILE.race} \
		$(GO) tool gotestsum --format testname -- -race -count=1 -timeout $(TEST_TIMEOUT) $(RACE_PKGS)
	@$(MAKE) --no-print-directory test-cuda-fake
	@$(MAKE) --no-print-directory fuzz

.PHONY: fuzz
fuzz: ## mutate every fuzz target in the tree (FUZZTIME executions each; FUZZ_BUDGETS for costly ones)
	@targets=$$(grep -rHo --include='*_test.go' --exclude-dir=.git --exclude-dir=bin '^func Fuzz[A-Za-z0-9_]*' . | sed 's/:func /:/' | sort); \
	[ -n "$$targets" ] || { echo "fuzz: no fuzz targets found"; exit 1; }; \
	for t in $$targets; do \
		file=$${t%%:*}; name=$${t##*:}; budget=$(FUZZTIME); \
		for b in $(FUZZ_BUDGETS); do [ "$${b%%=*}" = "$$name" ] && budget=$${b#*=}; done; \
		echo "fuzz: $$name in $$(dirname $$file) ($$budget)"; \
		$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$$budget ./$$(dirname $$file)/ || exit 1; \
	done

.PHONY: bench
bench: bench-steer ## run the benchmarks
	$(GO) test -run='^$$' -bench=. -benchmem ./...

.PHONY: bench-msg
bench-msg: ## messaging throughput on its own netns testbed (root): one datagram per message vs agents on DPUs/hosts, sweeps
	$(GO) run ./appliance/cmd/bench-msg -mtu 9000 $(BENCH_MSG_FLAGS)

.PHONY: bench-mem
bench-mem: ## far memory on its own netns testbed (root): chunk reads and writes direct vs through the DPU agent, host CPU per GiB, fault-in through the mapping
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/lovelockd ./appliance/cmd/lovelockd
	$(GO) run ./appliance/cmd/bench-mem -lovelockd $(BIN)/lovelockd $(BENCH_MEM_FLAGS)

.PHONY: bench-ingest
bench-ingest: ## accelerator ingest on its own netns testbed (root): Conspirator's TCP server vs host UDP vs through the DPU agent, host CPU per request, unloaded and with 80% host load, 64 KiB and 1 MiB inputs
	$(GO) run ./appliance/cmd/bench-ingest -size 64KiB $(BENCH_INGEST_FLAGS)
	$(GO) run ./appliance/cmd/bench-ingest -size 1MiB $(BENCH_INGEST_FLAGS)

# bench-ingest for a GPU machine (-device cuda): the CUDA backend links it
# dynamically (purego loads libcuda through the system's loader), so it is
# built here and carried; the GPU machine needs root, not Go.
.PHONY: bench-ingest-cuda-bin
bench-ingest-cuda-bin: ## build bench-ingest with the CUDA backend (-device cuda; dynamically linked) into bin/bench-ingest-cuda
	CGO_ENABLED=0 $(GO) build -tags cuda -trimpath -o $(BIN)/bench-ingest-cuda ./appliance/cmd/bench-ingest

.PHONY: bench-graph
bench-graph: ## graph apps (BFS, PageRank, CC, Radii, BC) over far memory on its own netns testbed (root): time and fabric bytes direct vs through the DPU agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/lovelockd ./appliance/cmd/lovelockd
	$(GO) run ./appliance/cmd/bench-graph -lovelockd $(BIN)/lovelockd $(BENCH_GRAPH_FLAGS)

.PHONY: bench-sched
bench-sched: ## MIG scheduling policies: GPU-hours, allocation rate, gap to the exact optimum, decisions/s (~1 min)
	$(GO) run ./dataplane/ingest/sched/cmd/bench-sched $(BENCH_SCHED_FLAGS)

.PHONY: bench-steer
bench-steer: ## per-packet cost of the steering classifier against an XDP_PASS floor (root)
	$(GO) run ./control/cmd/bench-steer

.PHONY: bench-steer-throughput
bench-steer-throughput: ## packets/s through a veth testbed: floor, classifier, redirect, xsk (root, ~1 min)
	$(GO) run ./control/cmd/bench-steer -throughput

# The CUDA device's GPU tests against a fake libcuda built from C (ABI and
# flows without a GPU; docs/ingest-cuda.md). On a GPU machine run the real
# ones: go test -tags gpu -c -o cuda.test ./dataplane/ingest/devmem/cuda/
# The Python workers' CUDA path (cupy, torch) has its own GPU tests, which
# the fake cannot run: CGO_ENABLED=0 go test -tags gpu -c -o hostagent.test
# ./dataplane/ingest/hostagent/, then on the GPU machine, from anywhere in
# a copy of this tree, with python3, numpy, cupy and torch:
# ./hostagent.test -test.run GPU -test.v -test.count=1
.PHONY: test-cuda-fake
test-cuda-fake: ## the CUDA device's GPU tests against a fake libcuda.so.1 (needs clang; no GPU)
	@dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
	clang -O1 -Wall -shared -fPIC -o $$dir/libcuda.so.1 dataplane/ingest/devmem/cuda/testdata/fakecuda.c && \
	CGO_ENABLED=0 $(GO) test -tags gpu -c -o $$dir/cuda.test ./dataplane/ingest/devmem/cuda/ && \
	cd $$dir && LD_LIBRARY_PATH=$$dir ./cuda.test -test.count=1 -test.v | grep -E '^(---|ok|PASS|FAIL)|GB/s'

# lovelockd for GPU hosts: the same daemon with the CUDA backend of
# ingest_host (device: cuda). purego loads libcuda through the system's
# dynamic loader, so this binary is dynamically linked against glibc; the
# DPU image ships the static build without it.
.PHONY: lovelockd-cuda
lovelockd-cuda: ## lovelockd with the CUDA backend for GPU hosts (dynamically linked) into bin/
	CGO_ENABLED=0 $(GO) build -tags cuda -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/lovelockd-cuda ./appliance/cmd/lovelockd

.PHONY: lint
lint: ## gofmt, go vet, the layer test and staticcheck
	@bad=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$bad" ]; then echo "gofmt would change:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags gpu ./dataplane/ingest/devmem/cuda/ ./dataplane/ingest/hostagent/
	@# The GPU tests run where a GPU is lent; here they are compiled, not run or skipped.
	CGO_ENABLED=0 $(GO) test -tags gpu -c -o /dev/null ./dataplane/ingest/devmem/cuda/
	CGO_ENABLED=0 $(GO) test -tags gpu -c -o /dev/null ./dataplane/ingest/hostagent/
	$(GO) vet -tags cuda ./appliance/service/ingestservice/ ./appliance/cmd/lovelockd/ ./appliance/cmd/bench-ingest/
	$(GO) test -count=1 -run '^TestLayers' ./appliance/
	$(GO) tool staticcheck ./...

.PHONY: demo
demo: deps ## the testbed demo: lovelockd on DPUs, rules, mixed traffic, counters, the planner
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/lovelock ./control/cmd/lovelock
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/lovelockd ./appliance/cmd/lovelockd
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/bench-msg ./appliance/cmd/bench-msg
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/bench-mem ./appliance/cmd/bench-mem
	BIN=$(BIN) PREFIX=$(PREFIX) appliance/examples/demo.sh

.PHONY: testbed-up
testbed-up: ## bring up the netns testbed (idempotent)
	$(GO) run ./control/cmd/lovelock testbed up --prefix $(PREFIX)

.PHONY: testbed-down
testbed-down: ## remove the netns testbed, also after a crash
	$(GO) run ./control/cmd/lovelock testbed down --prefix $(PREFIX)

.PHONY: clean
clean: ## remove build outputs
	rm -rf $(BIN)

# The DPU image: image-deps, image, image-test, image-lock, vagrant-validate.
include images/image.mk
