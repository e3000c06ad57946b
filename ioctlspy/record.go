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

// The record layouts: struct record_header and the records in
// bpf/gpuarb.h, as bpf2go generates them (nothing mirrored by hand).
var (
	hdr    bpf.RecordHeader
	ioctlR bpf.IoctlRecord
	callR  bpf.CallRecord
	launch bpf.LaunchRecord
	mapR   bpf.MapRecord
)

// Header layout, at the start of every record.
const (
	offTsEnter  = int(unsafe.Offsetof(hdr.TsEnter))
	offTsExit   = int(unsafe.Offsetof(hdr.TsExit))
	offCgroupID = int(unsafe.Offsetof(hdr.CgroupId))
	offType     = int(unsafe.Offsetof(hdr.Type))
	offTgid     = int(unsafe.Offsetof(hdr.Tgid))
	offTid      = int(unsafe.Offsetof(hdr.Tid))
	offFlags    = int(unsafe.Offsetof(hdr.Flags))
	offComm     = int(unsafe.Offsetof(hdr.Comm))
	commLen     = len(hdr.Comm)
	headerSize  = int(unsafe.Sizeof(hdr))
)

// Body layouts, from the start of the record.
const (
	offIoctlRet  = int(unsafe.Offsetof(ioctlR.Ret))
	offDevMajor  = int(unsafe.Offsetof(ioctlR.DevMajor))
	offDevMinor  = int(unsafe.Offsetof(ioctlR.DevMinor))
	offDevKind   = int(unsafe.Offsetof(ioctlR.DevKind))
	offCmd       = int(unsafe.Offsetof(ioctlR.Cmd))
	offEsc       = int(unsafe.Offsetof(ioctlR.Esc))
	offArgLen    = int(unsafe.Offsetof(ioctlR.ArgLen))
	offParamsLen = int(unsafe.Offsetof(ioctlR.ParamsLen))
	offIoctlArgs = int(unsafe.Offsetof(ioctlR.Args))
	offArg       = int(unsafe.Offsetof(ioctlR.Arg))
	offParams    = int(unsafe.Offsetof(ioctlR.Params))
	offFileIno   = int(unsafe.Offsetof(ioctlR.FileIno))
	offFileDev   = int(unsafe.Offsetof(ioctlR.FileDev))
	ioctlArgs    = len(ioctlR.Args)
	payloadLen   = len(ioctlR.Arg)
	ioctlSize    = int(unsafe.Sizeof(ioctlR))

	offCallRet  = int(unsafe.Offsetof(callR.Ret))
	offCallFunc = int(unsafe.Offsetof(callR.Func))
	offCallArgs = int(unsafe.Offsetof(callR.Args))
	callArgs    = len(callR.Args)
	callSize    = int(unsafe.Sizeof(callR))

	offFunction   = int(unsafe.Offsetof(launch.Function))
	offStream     = int(unsafe.Offsetof(launch.Stream))
	offLaunchFunc = int(unsafe.Offsetof(launch.Func))
	offGrid       = int(unsafe.Offsetof(launch.Grid))
	offBlock      = int(unsafe.Offsetof(launch.Block))
	launchSize    = int(unsafe.Sizeof(launch))

	offMapAddr  = int(unsafe.Offsetof(mapR.Addr))
	offMapLen   = int(unsafe.Offsetof(mapR.Len))
	offMapUnmap = int(unsafe.Offsetof(mapR.Unmap))
	offMapFD    = int(unsafe.Offsetof(mapR.Fd))
	mapSize     = int(unsafe.Sizeof(mapR))

	// RingBytesPerLaunch is what one launch takes of the ring buffer: its
	// record and the ring's 8-byte header, rounded up to 8 bytes.
	RingBytesPerLaunch = (launchSize + 8 + 7) &^ 7
)

// numArgs is the most arguments a record body carries.
const numArgs = max(ioctlArgs, callArgs)

// Record types and flags: enum event_type and enum event_flags.
const (
	recIoctl    = bpf.RecordIoctl
	recCuda     = bpf.RecordCuda
	recLaunch   = bpf.RecordLaunch
	recMap      = bpf.RecordMap
	recExit     = bpf.RecordExit
	flagHeld    = bpf.FlagHeld
	flagBegin   = bpf.FlagBegin
	flagOOMKill = bpf.FlagOOMKill
)

// ErrShortRecord is returned for a record smaller than its type's layout.
var ErrShortRecord = errors.New("short record")

// Record is one raw probe record, its header and body, with its payloads
// cut to their lengths.
type Record struct {
	TsEnter, TsExit uint64
	CgroupID        uint64
	Type            uint32
	PID, TID        uint32
	Flags           uint32
	Comm            string

	Ret      int64  // an ioctl's or a call's return value
	Func     uint32 // a call's or a launch's entry point (bpf.EntryPoint)
	DevMajor uint32 // an ioctl's device, its kind, command and RM escape
	DevMinor uint32
	DevKind  uint32
	Cmd      uint32
	Esc      uint32
	// Args are an ioctl's or a call's arguments, as its body has them.
	Args   [numArgs]uint64
	Arg    []byte // an ioctl's primary struct as read at exit
	Params []byte // an ioctl's secondary buffer (RM alloc/control params)
	// File is an ioctl's open file: its inode and filesystem.
	File FileID

	// A launch's function (a graph launch's CUgraphExec), stream, grid and
	// block.
	Function, Stream uint64
	Grid, Block      [3]uint32
}

// FileID is a file by its filesystem (the device as stat's st_dev has it)
// and inode number: what the daemon checks a duplicate of a process's
// control file against before it steers through it.
type FileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// recordSize is the layout's size of a record of type t; a type not known
// is read as its header.
func recordSize(t uint32) int {
	switch t {
	case recIoctl:
		return ioctlSize
	case recCuda:
		return callSize
	case recLaunch:
		return launchSize
	case recMap:
		return mapSize
	}
	return headerSize
}

// ParseRecord parses a raw record: its header, then the body its type
// names. Payload lengths beyond the record's buffers are clamped, never
// trusted.
func ParseRecord(b []byte) (Record, error) {
	if len(b) < headerSize {
		return Record{}, fmt.Errorf("%w: %d bytes, want a %d-byte header", ErrShortRecord, len(b), headerSize)
	}
	le := binary.LittleEndian
	r := Record{
		TsEnter:  le.Uint64(b[offTsEnter:]),
		TsExit:   le.Uint64(b[offTsExit:]),
		CgroupID: le.Uint64(b[offCgroupID:]),
		Type:     le.Uint32(b[offType:]),
		PID:      le.Uint32(b[offTgid:]),
		TID:      le.Uint32(b[offTid:]),
		Flags:    le.Uint32(b[offFlags:]),
		Comm:     cString(b[offComm : offComm+commLen]),
	}
	if want := recordSize(r.Type); len(b) < want {
		return Record{}, fmt.Errorf("%w: record type %d of %d bytes, want %d", ErrShortRecord, r.Type, len(b), want)
	}
	switch r.Type {
	case recIoctl:
		r.Ret = int64(le.Uint64(b[offIoctlRet:]))
		r.DevMajor = le.Uint32(b[offDevMajor:])
		r.DevMinor = le.Uint32(b[offDevMinor:])
		r.DevKind = le.Uint32(b[offDevKind:])
		r.Cmd = le.Uint32(b[offCmd:])
		r.Esc = le.Uint32(b[offEsc:])
		r.File = FileID{Dev: kernelDev(le.Uint32(b[offFileDev:])), Ino: le.Uint64(b[offFileIno:])}
		for i := range ioctlArgs {
			r.Args[i] = le.Uint64(b[offIoctlArgs+8*i:])
		}
		argLen := min(int(le.Uint16(b[offArgLen:])), payloadLen)
		paramsLen := min(int(le.Uint16(b[offParamsLen:])), payloadLen)
		r.Arg = append([]byte(nil), b[offArg:offArg+argLen]...)
		r.Params = append([]byte(nil), b[offParams:offParams+paramsLen]...)
	case recCuda:
		r.Ret = int64(le.Uint64(b[offCallRet:]))
		r.Func = le.Uint32(b[offCallFunc:])
		for i := range callArgs {
			r.Args[i] = le.Uint64(b[offCallArgs+8*i:])
		}
	case recMap:
		// An mmap's or munmap's address, length, whether it unmaps, and an
		// mmap's descriptor.
		r.Args[0] = le.Uint64(b[offMapAddr:])
		r.Args[1] = le.Uint64(b[offMapLen:])
		r.Args[2] = uint64(le.Uint32(b[offMapUnmap:]))
		r.Args[3] = uint64(le.Uint32(b[offMapFD:]))
	case recLaunch:
		r.Func = le.Uint32(b[offLaunchFunc:])
		r.Function = le.Uint64(b[offFunction:])
		r.Stream = le.Uint64(b[offStream:])
		for i := range 3 {
			r.Grid[i] = le.Uint32(b[offGrid+4*i:])
			r.Block[i] = le.Uint32(b[offBlock+4*i:])
		}
	}
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
