package libvirthook

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuarb/gpuarb/internal/atomicfile"
)

// DefaultHooksDir is where libvirt (6.5 and later) runs every executable
// as a qemu hook.
const DefaultHooksDir = "/etc/libvirt/hooks/qemu.d"

// scriptName is the hook script's file name in the hooks directory.
const scriptName = "gpuarb"

// scriptMarker identifies a script this package wrote.
const scriptMarker = "# written by gpuarb hooks install --runtime libvirt"

// Script returns the hook script that runs `BINARY libvirt-hook` with
// libvirt's arguments (and --socket when socket is not "").
func Script(binary, socket string) []byte {
	args := []string{shellQuote(binary), "libvirt-hook"}
	if socket != "" {
		args = append(args, "--socket", shellQuote(socket))
	}
	return []byte("#!/bin/sh\n" + scriptMarker + "\nexec " + strings.Join(args, " ") + " \"$@\"\n")
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// InstallScript writes the hook script into dir (created if missing) and
// returns its path. libvirtd reads the directory when it starts: restart
// it once after the first install.
func InstallScript(dir, binary, socket string) (string, error) {
	if !filepath.IsAbs(binary) {
		return "", fmt.Errorf("the hook needs an absolute binary path, got %q", binary)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	path := filepath.Join(dir, scriptName)
	if err := atomicfile.Write(path, Script(binary, socket), 0o755); err != nil {
		return "", fmt.Errorf("install the hook script: %w", err)
	}
	return path, nil
}

// UninstallScript removes the hook script from dir if this package wrote
// it; removed is false when there was none.
func UninstallScript(dir string) (removed bool, err error) {
	path := filepath.Join(dir, scriptName)
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if !bytes.Contains(b, []byte(scriptMarker)) {
		return false, fmt.Errorf("%s was not written by gpuarb: left in place", path)
	}
	if err := os.Remove(path); err != nil {
		return false, fmt.Errorf("remove %s: %w", path, err)
	}
	return true, nil
}
