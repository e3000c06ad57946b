#!/usr/bin/env bash
# Installs what building and testing gpuarb needs on a Debian/Ubuntu host:
# clang/llvm and libbpf headers (BPF objects), bpftool (map dumps), gcc and
# make (the simulated GPU's C parts), runc and busybox-static (the container
# tests run real runc containers on a busybox rootfs), qemu-system-x86 (the
# libvirt hook test runs a real QEMU with TCG). Go itself must already be
# installed.
set -euo pipefail

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
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)

if [ ${#need[@]} -gt 0 ]; then
	echo "install-deps: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${need[@]}"
fi
command -v go >/dev/null || { echo "install-deps: Go is required (https://go.dev/dl)" >&2; exit 1; }
echo "install-deps: ok ($(go version | cut -d' ' -f3), $(clang --version | head -1))"
