package bpf

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Kind tells the probes how to decode ioctls on a device.
type Kind uint32

// Device kinds, as stored in the device table: enum dev_kind in gpuarb.h.
const (
	KindNone      = Kind(gpuarbDevKindDEV_NONE)
	KindNvidiaCtl = Kind(gpuarbDevKindDEV_NVIDIA_CTL) // /dev/nvidiactl: RM escapes
	KindNvidiaGPU = Kind(gpuarbDevKindDEV_NVIDIA_GPU) // /dev/nvidiaN: RM escapes
	KindNvidiaUVM = Kind(gpuarbDevKindDEV_NVIDIA_UVM) // /dev/nvidia-uvm: plain integer commands
	KindDRM       = Kind(gpuarbDevKindDEV_DRM)        // /dev/dri/*: DRM and nouveau ioctls
)

const anyMinor = 0xffffffff

var kindNames = map[Kind]string{
	KindNvidiaCtl: "nvidia-ctl",
	KindNvidiaGPU: "nvidia-gpu",
	KindNvidiaUVM: "nvidia-uvm",
	KindDRM:       "drm",
}

func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(%d)", uint32(k))
}

// ParseKind accepts the kind names of String, and "nvidia" for nvidia-ctl.
func ParseKind(s string) (Kind, error) {
	if s == "nvidia" {
		return KindNvidiaCtl, nil
	}
	for k, n := range kindNames {
		if n == s {
			return k, nil
		}
	}
	return KindNone, fmt.Errorf("unknown device kind %q (want nvidia, nvidia-ctl, nvidia-gpu, nvidia-uvm or drm)", s)
}

// Device is one entry of the device table: a char device number (or a
// whole major) and how to decode its ioctls.
type Device struct {
	Major    uint32
	Minor    uint32
	AnyMinor bool
	Kind     Kind
}

func (d Device) String() string {
	minor := strconv.FormatUint(uint64(d.Minor), 10)
	if d.AnyMinor {
		minor = "*"
	}
	return fmt.Sprintf("%d:%s=%s", d.Major, minor, d.Kind)
}

// ParseDevice parses MAJ:MIN=KIND, where MIN may be "*" for every minor.
func ParseDevice(s string) (Device, error) {
	num, kind, ok := strings.Cut(s, "=")
	if !ok {
		return Device{}, fmt.Errorf("device %q: want MAJ:MIN=KIND", s)
	}
	majS, minS, ok := strings.Cut(num, ":")
	if !ok {
		return Device{}, fmt.Errorf("device %q: want MAJ:MIN=KIND", s)
	}
	var d Device
	maj, err := strconv.ParseUint(majS, 10, 12)
	if err != nil {
		return Device{}, fmt.Errorf("device %q: major %q: want 0-4095", s, majS)
	}
	d.Major = uint32(maj)
	if minS == "*" {
		d.AnyMinor = true
	} else {
		min, err := strconv.ParseUint(minS, 10, 20)
		if err != nil {
			return Device{}, fmt.Errorf("device %q: minor %q: want 0-1048575 or *", s, minS)
		}
		d.Minor = uint32(min)
	}
	if d.Kind, err = ParseKind(kind); err != nil {
		return Device{}, fmt.Errorf("device %q: %w", s, err)
	}
	return d, nil
}

// nvidiaCtlMinor is the minor of /dev/nvidiactl under the nvidia major.
const nvidiaCtlMinor = 255

// HostDevices derives the device table from /proc/devices: the nvidia
// major (nvidiactl at minor 255, GPUs at the others), nvidia-uvm and drm.
func HostDevices() ([]Device, error) {
	f, err := os.Open("/proc/devices")
	if err != nil {
		return nil, fmt.Errorf("read /proc/devices: %w", err)
	}
	defer f.Close()
	return parseProcDevices(f)
}

func parseProcDevices(r io.Reader) ([]Device, error) {
	var out []Device
	sc := bufio.NewScanner(r)
	char := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch line {
		case "Character devices:":
			char = true
			continue
		case "Block devices:":
			char = false
			continue
		}
		if !char {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			continue
		}
		maj, err := strconv.ParseUint(fields[0], 10, 12)
		if err != nil {
			continue
		}
		m := uint32(maj)
		switch fields[1] {
		case "nvidia-frontend", "nvidia":
			out = append(out,
				Device{Major: m, Minor: nvidiaCtlMinor, Kind: KindNvidiaCtl},
				Device{Major: m, AnyMinor: true, Kind: KindNvidiaGPU})
		case "nvidia-uvm":
			out = append(out, Device{Major: m, AnyMinor: true, Kind: KindNvidiaUVM})
		case "drm":
			out = append(out, Device{Major: m, AnyMinor: true, Kind: KindDRM})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse /proc/devices: %w", err)
	}
	return out, nil
}
