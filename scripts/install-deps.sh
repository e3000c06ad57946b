#!/usr/bin/env bash
# Installs what building and testing gpuarb needs on a Debian/Ubuntu host:
# clang/llvm and libbpf headers (BPF objects), bpftool (map dumps), gcc and
# make (the simulated GPU's C parts), runc and busybox-static (the container
# tests run real runc containers on a busybox rootfs) and, with --test:
# - qemu-system-x86 (the libvirt hook's test runs a real QEMU with TCG);
# - prometheus (the dashboard test queries a real one);
# - Debian's containerd 1.6 (the hook's test on containerd 1.x);
# - containerd 2.x and crictl, built from the Go module proxy into
#   /opt/gpuarb-test/bin (the NRI tests run pods on a real containerd;
#   Debian ships none with NRI).
# Go itself must already be installed; it is looked for in PATH and where it
# is usually installed (sudo drops /usr/local/go/bin from PATH).
set -euo pipefail
tests=false
case "${1:-}" in
--test) tests=true ;;
"") ;;
*) echo "usage: $0 [--test]" >&2; exit 2 ;;
esac
export PATH="$PATH:/usr/local/go/bin:/usr/lib/go/bin"

need=()
command -v clang >/dev/null || need+=(clang)
command -v llvm-strip >/dev/null || need+=(llvm)
command -v bpftool >/dev/null || need+=(bpftool)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
[ -f /usr/include/x86_64-linux-gnu/asm/types.h ] || need+=(linux-libc-dev)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
command -v runc >/dev/null || need+=(runc)
command -v busybox >/dev/null || need+=(busybox-static)
if $tests; then
	command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
	command -v prometheus >/dev/null || need+=(prometheus)
	[ -x /usr/bin/containerd ] || need+=(containerd)
fi

if [ ${#need[@]} -gt 0 ]; then
	echo "install-deps: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${need[@]}"
fi
command -v go >/dev/null || {
	echo "install-deps: Go is required: install Go $(sed -n 's/^go //p' go.mod) or later from https://go.dev/dl into /usr/local/go, or put its bin directory in PATH (sudo keeps only secure_path)" >&2
	exit 1
}
# The NRI test's containerd and crictl (about 7 minutes on 2 CPUs; kept
# across runs, their versions in a stamp file). containerd's go.mod has
# exclude directives, so `go install` refuses it: it is built from a copy
# of its module.
containerd_version=v2.1.9
crictl_version=v1.34.0
testbin=/opt/gpuarb-test/bin
stamp="containerd $containerd_version crictl $crictl_version"
if $tests && [ "$(cat "$testbin/VERSIONS" 2>/dev/null)" != "$stamp" ]; then
	echo "install-deps: building containerd $containerd_version and crictl $crictl_version into $testbin"
	mkdir -p "$testbin"
	src=$(mktemp -d)
	trap 'rm -rf "$src"' EXIT
	(cd "$src" && go mod download "github.com/containerd/containerd/v2@$containerd_version")
	cp -r "$(go env GOMODCACHE)/github.com/containerd/containerd/v2@$containerd_version/." "$src/containerd"
	chmod -R u+w "$src"
	(cd "$src/containerd" && GOFLAGS=-mod=mod go build -o "$testbin/" -tags no_btrfs ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr)
	(cd "$src" && GOBIN="$testbin" go install "sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version")
	echo "$stamp" > "$testbin/VERSIONS"
fi
if $tests; then
	echo "install-deps: for the tests: $("$testbin/containerd" --version) and crictl $crictl_version (NRI), $(/usr/bin/containerd --version) (the hook), $(prometheus --version 2>&1 | head -1)"
fi
echo "install-deps: ok ($(go version | cut -d' ' -f3), $(clang --version | head -1))"
