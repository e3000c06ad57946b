// Package ioctlspy turns the probes' raw ring-buffer records into typed GPU
// events: nvidia RM allocations, controls and frees, uvm channel
// registrations, nouveau channels, submissions and waits, and libcuda calls
// (launches, graph launches, copies, syncs, contexts, memory). It keeps the
// per-process table of GPU contexts and channels. Decoders treat every byte
// as hostile: short, truncated or malformed records give errors, never panics.
package ioctlspy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Record layout, mirroring struct event in bpf/gpuarb.h.
const (
	offTsEnter   = 0
	offTsExit    = 8
	offCgroupID  = 16
	offRet       = 24
	offType      = 32
	offTgid      = 36
	offTid       = 40
	offDevMajor  = 44
	offDevMinor  = 48
	offDevKind   = 52
	offCmd       = 56
	offEsc       = 60
	offFunc      = 64
	offArgLen    = 68
	offParamsLen = 70
	offFlags     = 72
	offComm      = 80
	offArgs      = 96
	offArg       = 160
	offParams    = 224
	offPath      = 288

	commLen    = 16
	numArgs    = 8
	payloadLen = 64
	pathLen    = 128

	// RecordSize is the size of one raw record.
	RecordSize = 416
)

// Record types, as enum event_type in bpf/gpuarb.h.
const (
	recIoctl       = 1
	recCuda        = 2
	recExit        = 3
	recLibcudaOpen = 4
)

// Record flags, as enum event_flags in bpf/gpuarb.h: the launch gate held
// the process at this call (EVF_HELD); a wait began (EVF_BEGIN).
const (
	flagHeld  = 1
	flagBegin = 2
)

// ErrShortRecord is returned for a record smaller than RecordSize.
var ErrShortRecord = errors.New("short record")

// Record is one raw probe record with its payloads cut to their lengths.
type Record struct {
	TsEnter, TsExit uint64
	CgroupID        uint64
	Ret             int64
	Type            uint32
	PID, TID        uint32
	DevMajor        uint32
	DevMinor        uint32
	DevKind         uint32
	Cmd             uint32
	Esc             uint32
	Func            uint32
	Flags           uint32
	Comm            string
	Args            [numArgs]uint64
	Arg             []byte // primary ioctl struct as read at exit
	Params          []byte // secondary buffer (RM alloc/control params)
	Path            string
}

// ParseRecord parses a raw record. Payload lengths beyond the record's
// buffers are clamped, never trusted.
func ParseRecord(b []byte) (Record, error) {
	if len(b) < RecordSize {
		return Record{}, fmt.Errorf("%w: %d bytes, want %d", ErrShortRecord, len(b), RecordSize)
	}
	le := binary.LittleEndian
	r := Record{
		TsEnter:  le.Uint64(b[offTsEnter:]),
		TsExit:   le.Uint64(b[offTsExit:]),
		CgroupID: le.Uint64(b[offCgroupID:]),
		Ret:      int64(le.Uint64(b[offRet:])),
		Type:     le.Uint32(b[offType:]),
		PID:      le.Uint32(b[offTgid:]),
		TID:      le.Uint32(b[offTid:]),
		DevMajor: le.Uint32(b[offDevMajor:]),
		DevMinor: le.Uint32(b[offDevMinor:]),
		DevKind:  le.Uint32(b[offDevKind:]),
		Cmd:      le.Uint32(b[offCmd:]),
		Esc:      le.Uint32(b[offEsc:]),
		Func:     le.Uint32(b[offFunc:]),
		Flags:    le.Uint32(b[offFlags:]),
		Comm:     cString(b[offComm : offComm+commLen]),
		Path:     cString(b[offPath : offPath+pathLen]),
	}
	for i := range r.Args {
		r.Args[i] = le.Uint64(b[offArgs+8*i:])
	}
	argLen := min(int(le.Uint16(b[offArgLen:])), payloadLen)
	paramsLen := min(int(le.Uint16(b[offParamsLen:])), payloadLen)
	r.Arg = append([]byte(nil), b[offArg:offArg+argLen]...)
	r.Params = append([]byte(nil), b[offParams:offParams+paramsLen]...)
	return r, nil
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// fields reads little-endian integers from a payload with bounds checks.
type fields []byte

func (f fields) u32(off int) (uint32, bool) {
	if off < 0 || off+4 > len(f) {
		return 0, false
	}
	return binary.LittleEndian.Uint32(f[off:]), true
}

func (f fields) u64(off int) (uint64, bool) {
	if off < 0 || off+8 > len(f) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(f[off:]), true
}
