#!/usr/bin/env bash
# Installs what building and testing gpuarb needs on a Debian/Ubuntu host:
# clang/llvm and libbpf headers (BPF objects), bpftool (map dumps), gcc and
# make (the simulated GPU's C parts), runc and busybox-static (the container
# tests run real runc containers on a busybox rootfs) and, with --test,
# qemu-system-x86 (only the libvirt hook test needs it: it runs a real QEMU
# with TCG). Go itself must already be installed; it is looked for in PATH
# and where it is usually installed (sudo drops /usr/local/go/bin from PATH).
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
echo "install-deps: ok ($(go version | cut -d' ' -f3), $(clang --version | head -1))"
