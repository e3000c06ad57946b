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
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/bpf"
)

// rec gives the record layout: struct event in bpf/gpuarb.h, as bpf2go
// generates it (nothing mirrored by hand).
var rec bpf.Record

// Record layout.
const (
	offTsEnter   = int(unsafe.Offsetof(rec.TsEnter))
	offTsExit    = int(unsafe.Offsetof(rec.TsExit))
	offCgroupID  = int(unsafe.Offsetof(rec.CgroupId))
	offRet       = int(unsafe.Offsetof(rec.Ret))
	offType      = int(unsafe.Offsetof(rec.Type))
	offTgid      = int(unsafe.Offsetof(rec.Tgid))
	offTid       = int(unsafe.Offsetof(rec.Tid))
	offDevMajor  = int(unsafe.Offsetof(rec.DevMajor))
	offDevMinor  = int(unsafe.Offsetof(rec.DevMinor))
	offDevKind   = int(unsafe.Offsetof(rec.DevKind))
	offCmd       = int(unsafe.Offsetof(rec.Cmd))
	offEsc       = int(unsafe.Offsetof(rec.Esc))
	offFunc      = int(unsafe.Offsetof(rec.Func))
	offArgLen    = int(unsafe.Offsetof(rec.ArgLen))
	offParamsLen = int(unsafe.Offsetof(rec.ParamsLen))
	offFlags     = int(unsafe.Offsetof(rec.Flags))
	offComm      = int(unsafe.Offsetof(rec.Comm))
	offArgs      = int(unsafe.Offsetof(rec.Args))
	offArg       = int(unsafe.Offsetof(rec.Arg))
	offParams    = int(unsafe.Offsetof(rec.Params))
	offFileIno   = int(unsafe.Offsetof(rec.FileIno))
	offFileDev   = int(unsafe.Offsetof(rec.FileDev))

	commLen    = len(rec.Comm)
	numArgs    = len(rec.Args)
	payloadLen = len(rec.Arg)

	// RecordSize is the size of one raw record.
	RecordSize = int(unsafe.Sizeof(rec))
)

// Record types and flags: enum event_type and enum event_flags.
const (
	recIoctl    = bpf.RecordIoctl
	recCuda     = bpf.RecordCuda
	recExit     = bpf.RecordExit
	flagHeld    = bpf.FlagHeld
	flagBegin   = bpf.FlagBegin
	flagOOMKill = bpf.FlagOOMKill
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
	// File is an ioctl's open file: its inode and filesystem.
	File FileID
}

// FileID is a file by its filesystem (the device as stat's st_dev has it)
// and inode number: what the daemon checks a duplicate of a process's
// control file against before it steers through it.
type FileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
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
		File:     FileID{Dev: kernelDev(le.Uint32(b[offFileDev:])), Ino: le.Uint64(b[offFileIno:])},
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

// kernelDev turns a kernel dev_t (major << 20 | minor) into the encoding
// stat(2) reports.
func kernelDev(d uint32) uint64 { return unix.Mkdev(d>>20, d&0xfffff) }

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
