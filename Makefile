# gpuarb: see README.md. `make demo` runs it on the simulated GPU, `make test` runs every test.
GO        ?= go
CC        ?= gcc
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BIN       := bin
CFLAGS    := -O2 -g -Wall -Wextra -Werror
GOFLAGS_B := -trimpath -ldflags "-X main.version=$(VERSION)"
GOTEST    ?= $(GO) test
PREFIX    ?= /usr/local
# sudo's secure_path drops where Go is usually installed: look there too.
export PATH := $(PATH):/usr/local/go/bin:/usr/lib/go/bin

LIBCUDA_SRC := $(wildcard e2e/fakegpu/libcuda/*.c e2e/fakegpu/libcuda/*.h)
GO_SRC      := $(shell find . -name '*.go' -not -path './bin/*') go.mod go.sum

.PHONY: all build generate check-generate test test-unit fuzz lint demo bench realgpu clean deps deps-test install

all: build

build: $(BIN)/gpuarb $(BIN)/fakegpud $(BIN)/libcuda.so.1 $(BIN)/gpuwork $(BIN)/gpuwork-static $(BIN)/gpuarb-lab $(BIN)/forkstorm

$(BIN)/gpuarb: $(GO_SRC)
	$(GO) build $(GOFLAGS_B) -o $@ ./cmd/gpuarb

# The demo and the benchmarks on the simulated GPU.
$(BIN)/gpuarb-lab: $(GO_SRC)
	$(GO) build $(GOFLAGS_B) -o $@ ./cmd/gpuarb-lab

$(BIN)/fakegpud: $(GO_SRC)
	$(GO) build $(GOFLAGS_B) -o $@ ./e2e/fakegpu/cmd/fakegpud

$(BIN)/libcuda.so.1: $(LIBCUDA_SRC)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden -fno-ipa-icf -shared -Wl,-soname,libcuda.so.1 -o $@ $(filter %.c,$(LIBCUDA_SRC)) -lpthread

# The workloads load libcuda.so.1 with dlopen, found beside them through RUNPATH.
GPUWORK_SRC := $(wildcard e2e/fakegpu/workloads/*.c e2e/fakegpu/workloads/*.h)

$(BIN)/gpuwork: $(GPUWORK_SRC)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -Wl,-rpath,'$$ORIGIN' -o $@ $(filter %.c,$(GPUWORK_SRC)) -ldl -lm -lpthread

# gpuwork with the simulated driver linked in and stripped: a tenant that
# maps no libcuda and whose launches no uprobe sees (issue 18, item 7).
$(BIN)/gpuwork-static: $(GPUWORK_SRC) $(LIBCUDA_SRC)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -DGPUWORK_STATIC -s -o $@ $(filter %.c,$(GPUWORK_SRC) $(LIBCUDA_SRC)) -lpthread -lm

# A hostile tenant's fork storm (lab.ForkStorm): the e2e test and bench §8.
$(BIN)/forkstorm: lab/forkstorm/forkstorm.c
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -o $@ $<

# Regenerates the BPF objects (needs clang, llvm-strip, libbpf headers).
generate:
	$(GO) generate ./bpf/...

# Fails when the committed BPF objects differ from a fresh build.
check-generate: generate
	@git diff --exit-code --stat -- bpf/ || { echo "bpf objects are stale: run make generate and commit"; exit 1; }

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed: $$out"; exit 1; }
	$(GO) vet ./...

# Every test, the privileged ones included (they need root; with CI=true a
# skipped privileged test is a failure). Packages run one at a time: probes
# see every process on the host, so one package's workloads would show up
# in another's measurements.
test: deps-test build lint
	GPUARB_BIN=$(CURDIR)/$(BIN) $(GOTEST) -p 1 -count=1 -timeout 40m ./...

test-unit:
	$(GOTEST) -count=1 -short ./...

# Fuzzes every parser of untrusted bytes for FUZZTIME each (make test runs
# their seed corpora and the failures found so far, in testdata/fuzz).
FUZZTIME ?= 30s
FUZZ_TARGETS := ./policy:FuzzParse ./oci-hook:FuzzRulesFromAnnotations ./oci-hook:FuzzReadState \
	./libvirt-hook:FuzzReadDomain ./ioctlspy:FuzzDecode ./bpf:FuzzParseDevice ./bpf:FuzzReadExports ./bpf:FuzzOpenRegular \
	./meter:FuzzEventStream
fuzz: build
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t for $(FUZZTIME)"; \
		GPUARB_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s "$${t%%:*}" || exit 1; \
	done

# Three runc containers attached by the OCI hook, unarbitrated then under
# gpuarb; writes gpuarb-demo.png. Needs root.
demo: deps build
	$(BIN)/gpuarb-lab demo

# Regenerates BENCHMARKS.md and its charts (about 15 minutes, then about 70
# for the fuzzer's 100 seeds). Needs root.
bench: deps build
	$(BIN)/gpuarb-lab bench --out BENCHMARKS.md

# The real-GPU check (docs/driver.md §4) on a host with an NVIDIA GPU,
# CUDA and PyTorch; at most 10 minutes, no network: binaries already built
# (carried to the GPU host) are used as they are. Writes e2e/realgpu/.
realgpu:
	@test -x $(BIN)/gpuarb-lab -a -x $(BIN)/gpuarb || $(MAKE) build
	$(BIN)/gpuarb-lab realgpu --out e2e/realgpu

# Installs gpuarb and its systemd unit (enable with systemctl enable --now gpuarb).
install: $(BIN)/gpuarb
	install -D -m 0755 $(BIN)/gpuarb $(DESTDIR)$(PREFIX)/bin/gpuarb
	install -D -m 0644 deploy/systemd/gpuarb.service $(DESTDIR)/etc/systemd/system/gpuarb.service

deps:
	./scripts/install-deps.sh

# What the tests need besides: QEMU for the libvirt hook's test.
deps-test:
	./scripts/install-deps.sh --test

clean:
	rm -rf $(BIN)
