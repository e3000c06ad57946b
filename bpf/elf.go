package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// The ELF files gpuarb reads are a tenant's (whatever a GPU process maps
// executable): they are read by this bounded reader alone, never by
// debug/elf (which allocates as a file's headers say: a zero-filled 15 MiB
// .dynsym in a sparse file took 93 MiB) nor by the uprobe library (which
// reads every symbol table to resolve names: gpuarb hands it file
// offsets). It reads the ELF header, the program and section headers and
// the dynamic symbol table with its strings, each bounded below, and
// nothing else: at most maxELFHeaders + maxDynsym + maxDynstr bytes a file.
const (
	maxSections   = 1024 // section headers read (a shared object has tens)
	maxSegments   = 256  // program headers read
	maxELFHeaders = 64 + 256*56 + 1024*64
	maxDynsym     = 2 << 20 // bytes of .dynsym (a real libcuda's are under 1 MiB)
	maxDynstr     = 2 << 20 // bytes of .dynstr
	maxSymbolName = 128     // a longer name is no entry point's
	// maxELFSize bounds the files read as ELF: libcuda is some 100 MB; a
	// file claiming more is not one.
	maxELFSize = 1 << 30
)

// export is a function a shared object exports: its name and its file
// offset, where a uprobe goes.
type export struct {
	name   string
	offset uint64
}

// errNotELF marks a file that is no 64-bit little-endian ELF shared
// object gpuarb can probe.
var errNotELF = errors.New("not a 64-bit little-endian ELF file")

// elfSection is what readExports uses of a section header.
type elfSection struct {
	typ          uint32
	offset, size uint64
	link         uint32
	entsize      uint64
}

// elfSegment is what readExports uses of a program header: an executable
// loadable segment's file offset and address range.
type elfSegment struct {
	offset, vaddr, memsz uint64
}

const (
	shtStrtab = 3
	shtDynsym = 11
	ptLoad    = 1
	pfX       = 1
	sttFunc   = 2
	symSize   = 24
)

// readExports lists the defined functions whose names start with "cu"
// that an ELF shared object of size bytes exports (its dynamic symbol
// table), with their file offsets, sorted by name; a symbol outside every
// executable segment is left out. Malformed or oversized input is an
// error (errNotELF or one naming the bound), never a panic or an
// allocation beyond the bounds above.
func readExports(r io.ReaderAt, size int64) ([]export, error) {
	if size < 64 || size > maxELFSize {
		return nil, fmt.Errorf("%w: %d bytes", errNotELF, size)
	}
	var hdr [64]byte
	if _, err := r.ReadAt(hdr[:], 0); err != nil {
		return nil, fmt.Errorf("elf header: %w", err)
	}
	if !bytes.Equal(hdr[:4], []byte("\x7fELF")) || hdr[4] != 2 || hdr[5] != 1 {
		return nil, errNotELF
	}
	le := binary.LittleEndian
	phoff, shoff := le.Uint64(hdr[32:]), le.Uint64(hdr[40:])
	phentsize, phnum := le.Uint16(hdr[54:]), le.Uint16(hdr[56:])
	shentsize, shnum := le.Uint16(hdr[58:]), le.Uint16(hdr[60:])
	if phentsize != 56 || shentsize != 64 || phnum == 0 || shnum == 0 || phnum > maxSegments || shnum > maxSections {
		return nil, fmt.Errorf("%w: %d program headers of %d bytes, %d sections of %d bytes", errNotELF, phnum, phentsize, shnum, shentsize)
	}
	phdrs, err := readRange(r, size, phoff, uint64(phnum)*56, "program headers")
	if err != nil {
		return nil, err
	}
	var segs []elfSegment
	for i := range int(phnum) {
		p := phdrs[i*56:]
		if le.Uint32(p) == ptLoad && le.Uint32(p[4:])&pfX != 0 {
			segs = append(segs, elfSegment{offset: le.Uint64(p[8:]), vaddr: le.Uint64(p[16:]), memsz: le.Uint64(p[40:])})
		}
	}
	shdrs, err := readRange(r, size, shoff, uint64(shnum)*64, "section headers")
	if err != nil {
		return nil, err
	}
	sections := make([]elfSection, shnum)
	dynsym := -1
	for i := range sections {
		s := shdrs[i*64:]
		sections[i] = elfSection{typ: le.Uint32(s[4:]), offset: le.Uint64(s[24:]), size: le.Uint64(s[32:]), link: le.Uint32(s[40:]),
			entsize: le.Uint64(s[56:])}
		if sections[i].typ == shtDynsym && dynsym < 0 {
			dynsym = i
		}
	}
	if dynsym < 0 {
		return nil, fmt.Errorf("%w: no dynamic symbol table", errNotELF)
	}
	sym := sections[dynsym]
	if sym.entsize != symSize || sym.size%symSize != 0 || sym.size > maxDynsym {
		return nil, fmt.Errorf("%w: a dynamic symbol table of %d bytes in entries of %d (at most %d bytes)", errNotELF, sym.size,
			sym.entsize, maxDynsym)
	}
	if int(sym.link) >= len(sections) || sections[sym.link].typ != shtStrtab || sections[sym.link].size > maxDynstr {
		return nil, fmt.Errorf("%w: the dynamic symbol table's strings are missing or over %d bytes", errNotELF, maxDynstr)
	}
	str := sections[sym.link]
	syms, err := readRange(r, size, sym.offset, sym.size, "dynamic symbols")
	if err != nil {
		return nil, err
	}
	strs, err := readRange(r, size, str.offset, str.size, "dynamic symbol names")
	if err != nil {
		return nil, err
	}
	var out []export
	for i := 0; i+symSize <= len(syms); i += symSize {
		s := syms[i:]
		name, info, shndx, value := le.Uint32(s), s[4], le.Uint16(s[6:]), le.Uint64(s[8:])
		if info&0xf != sttFunc || shndx == 0 || value == 0 || uint64(name) >= uint64(len(strs)) {
			continue
		}
		n := strs[name:min(len(strs), int(name)+maxSymbolName+1)]
		end := bytes.IndexByte(n, 0)
		if end < 0 || !strings.HasPrefix(string(n[:end]), "cu") {
			continue
		}
		for _, seg := range segs {
			if seg.vaddr <= value && value-seg.vaddr < seg.memsz {
				out = append(out, export{name: string(n[:end]), offset: value - seg.vaddr + seg.offset})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b export) int { return strings.Compare(a.name, b.name) })
	return slices.CompactFunc(out, func(a, b export) bool { return a.name == b.name }), nil
}

// readRange reads n bytes at off, both within a file of size bytes.
func readRange(r io.ReaderAt, size int64, off, n uint64, what string) ([]byte, error) {
	if off > uint64(size) || n > uint64(size)-off {
		return nil, fmt.Errorf("%w: %s at %d+%d beyond the file's %d bytes", errNotELF, what, off, n, size)
	}
	buf := make([]byte, n)
	if _, err := r.ReadAt(buf, int64(off)); err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return buf, nil
}
