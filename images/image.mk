# The Lovelock DPU image: build, boot test, Vagrant check.
# Included from the main Makefile (include images/image.mk); uses its GO, BIN,
# LDFLAGS and VERSION. See docs/image.md.
#
#   make image        bin/image/{amd64,arm64}/: kernel, initramfs, manifest, arm64 .bfb
#   make image-test   boot both in QEMU (software emulation) and check lovelockd from inside
#   make image-bpf-test  run the BPF packages' tests inside the image's kernel (QEMU, amd64)
#   make image-bpf-test-older  run the version-dependent tests inside Debian's 6.1 (QEMU, amd64)
#   make image-lock   re-pin the Debian kernels to what the mirror has now
#   make vagrant-validate

IMAGE_DIR    ?= $(BIN)/image
IMAGE_ARCHES ?= amd64 arm64
IMAGE_BOOTS  ?= amd64,arm64,arm64-uefi
# The card's firmware stream (package mlxbf-bootimages, not redistributable:
# never commit it). Without it the .bfb is an OS-only stream.
DEFAULT_BFB  ?=
# Set to 1 to refresh apt's lists even when nothing is missing (after the
# mirror moved on to a newer kernel).
IMAGE_APT_UPDATE ?=
IMAGE_APT_PACKAGES := qemu-system-x86 qemu-system-arm qemu-efi-aarch64 vagrant
# image-bpf-test: the guests (amd64 keeps CI fast; arm64 works too) and the
# test packages run inside them, each as a static test binary, comma-separated,
# each with flags for its binary after a space. Of control/rules only the tests
# that classify through the kernel, on fewer rule sets, and of control/attach
# the ones whose kernel behaviour differs by version (links, tcx and clsact,
# re-created interfaces, the upgrade's directory swap and Link.Update): each
# program load is verified under emulation, which is slow, and the rest is Go
# logic the main test pass covers.
IMAGE_BPF_TEST_ARCHES ?= amd64
IMAGE_BPF_TEST_PKGS   ?= ./bpf/,./control/attach/ -test.run=TestOpenAdoptDetach|TestClsact|TestAdoptRecreatedInterface|TestUpgradeUnderTraffic,./dataplane/wire/,./control/rules/ -test.run=Differential|BPF|FuzzClassify -rules.sets=4
# image-bpf-test-older: the same in the lock file's older kernel (Debian's 6.1,
# images/kernel.lock.json "older"), only the tests whose kernel behaviour
# differs by version and that assert each version's: the netdev family
# (6.3+; before, rule sets apply with a warning), the clsact fallback
# before tcx (6.6+), and the verifier step with the parser and classifier
# against Go, since 6.1's verifier checks (and removes dead code) its own
# way. Not TestUpgradeUnderTraffic: it attaches through tcx itself.
IMAGE_BPF_OLDER_TEST_PKGS ?= ./control/netdev/ -test.run=TestDevXDPFeatures,./control/rules/ -test.run=TestXDPRedirect|Differential|BPF|FuzzClassify -rules.sets=4,./control/attach/ -test.run=TestOpenAdoptDetach|TestClsact|TestAdoptRecreatedInterface,./dataplane/wire/ -test.run=TestCParser|FuzzFrame
IMAGE_BPF_OLDER_FLAGS     ?=

.PHONY: image-deps
image-deps: ## install QEMU, UEFI firmware for arm64 and vagrant; enable arm64 packages in apt (idempotent)
	@need_update="$(IMAGE_APT_UPDATE)"; \
	if ! dpkg --print-foreign-architectures | grep -qx arm64; then \
		echo "image-deps: dpkg --add-architecture arm64 (the card's kernel package is arm64)"; \
		dpkg --add-architecture arm64; need_update=1; \
	fi; \
	ls /var/lib/apt/lists/*_binary-arm64_Packages* >/dev/null 2>&1 || need_update=1; \
	missing=$$(for p in $(IMAGE_APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	[ -z "$$missing" ] || need_update=1; \
	if [ -n "$$need_update" ]; then echo "image-deps: apt-get update"; apt-get update -qq; fi; \
	if [ -n "$$missing" ]; then \
		echo "image-deps: installing" $$missing; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

.PHONY: image
image: image-deps ## build the DPU image (amd64 and arm64: kernel, initramfs, manifest; arm64 .bfb) into bin/image
	$(GO) run ./images/cmd/mkimage build --out $(IMAGE_DIR) --go $(GO) \
		--ldflags '$(LDFLAGS)' --version $(VERSION) \
		$(foreach a,$(IMAGE_ARCHES),--arch $(a)) $(if $(DEFAULT_BFB),--default-bfb $(DEFAULT_BFB))

.PHONY: image-test
image-test: image ## boot the images in QEMU (no KVM) and check lovelockd and its XDP attach from inside
	$(GO) run ./images/cmd/boottest --image $(IMAGE_DIR) --cases $(IMAGE_BOOTS)

.PHONY: image-bpf-test
image-bpf-test: image-deps ## run the BPF packages' tests inside the image's 6.12 kernel under QEMU (no KVM): the target kernel's verifier
	@for a in $(IMAGE_BPF_TEST_ARCHES); do \
		$(GO) run ./images/cmd/bpftest --arch $$a --pkgs '$(IMAGE_BPF_TEST_PKGS)' \
			--out $(IMAGE_DIR)/bpftest --go $(GO) --timeout 900s || exit 1; \
	done

.PHONY: image-bpf-test-older
image-bpf-test-older: image-deps ## run the version-dependent tests inside Debian's 6.1 under QEMU (no KVM): no netdev family, no tcx
	$(GO) run ./images/cmd/bpftest --arch amd64 --kernel older $(IMAGE_BPF_OLDER_FLAGS) --pkgs '$(IMAGE_BPF_OLDER_TEST_PKGS)' \
		--out $(IMAGE_DIR)/bpftest --go $(GO) --timeout 240s

.PHONY: image-lock
image-lock: image-deps ## re-pin images/kernel.lock.json to the kernels the mirror has now (the older one within its series)
	$(GO) run ./images/cmd/mkimage lock $(foreach a,$(IMAGE_ARCHES),--arch $(a))

.PHONY: vagrant-validate
vagrant-validate: image-deps ## check vagrant/Vagrantfile (no VM boots; provider blocks are not checked)
	cd vagrant && vagrant validate --ignore-provider
