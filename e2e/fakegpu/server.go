package fakegpu

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSocket is where fakegpud listens unless told otherwise; clients
// take FAKEGPU_SOCKET from the environment.
const DefaultSocket = "/run/fakegpu/fakegpu.sock"

// Control nodes created beside the socket. libcuda issues its nvidia ioctls
// on NvidiaCtlNode (char 1:7), in nouveau mode DRM ioctls on DRMNode (char
// 1:3), and maps managed memory from UVMNode (char 1:5, the zero device,
// whose mappings are host pages); gpuarb is told to treat them as GPUs
// with --device 1:7=nvidia --device 1:3=drm --device 1:5=nvidia-uvm.
const (
	NvidiaCtlNode = "nvidiactl"
	DRMNode       = "renderD128"
	UVMNode       = "nvidia-uvm"
	NvidiaMajor   = 1
	NvidiaMinor   = 7
	DRMMajor      = 1
	DRMMinor      = 3
	UVMMajor      = 1
	UVMMinor      = 5
)

// ErrRunning is returned when another fakegpud serves the socket.
var ErrRunning = errors.New("another fakegpud is serving this socket")

// Server is fakegpud: the GPUs and the setup socket.
type Server struct {
	cfg    Config
	socket string
	gpus   []*gpu
	ln     *net.UnixListener

	reg     *registry
	nextCtx atomic.Uint64
	// driverSlices counts the contexts created, for the realism's turn of
	// driver-set timeslices.
	driverSlices atomic.Uint64
	mu           sync.Mutex
	conns        map[*net.UnixConn]struct{}
	resetAt      int64 // CLOCK_MONOTONIC ns of the last reset
	closed       bool
	wg           sync.WaitGroup
	nodes        []string
}

// NewServer creates the GPUs, the control nodes and the socket.
func NewServer(cfg Config, socket string) (_ *Server, err error) {
	cfg.setDefaults()
	if socket == "" {
		socket = DefaultSocket
	}
	s := &Server{cfg: cfg, socket: socket, conns: map[*net.UnixConn]struct{}{}, resetAt: monotonicNS(), reg: newRegistry()}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if c, err := net.Dial("unix", socket); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", socket, ErrRunning)
	}
	_ = os.Remove(socket) // a stale socket from a dead fakegpud
	for i := 0; i < cfg.GPUs; i++ {
		g, err := newGPU(i, &s.cfg, s.reg)
		if err != nil {
			return nil, err
		}
		s.gpus = append(s.gpus, g)
	}
	for _, n := range []struct {
		name         string
		major, minor uint32
	}{{NvidiaCtlNode, NvidiaMajor, NvidiaMinor}, {DRMNode, DRMMajor, DRMMinor}, {UVMNode, UVMMajor, UVMMinor}} {
		p := filepath.Join(filepath.Dir(socket), n.name)
		_ = os.Remove(p)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return nil, fmt.Errorf("create control node %s: %w", p, err)
		}
		_ = os.Chmod(p, 0o666)
		s.nodes = append(s.nodes, p)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", socket, err)
	}
	s.ln = ln
	if err := os.Chmod(socket, 0o666); err != nil {
		return nil, fmt.Errorf("chmod %s: %w", socket, err)
	}
	for _, g := range s.gpus {
		go g.run()
	}
	return s, nil
}

// Socket is the path the server listens on.
func (s *Server) Socket() string { return s.socket }

// Serve accepts clients until Close.
func (s *Server) Serve() error {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		s.mu.Lock()
		if s.closed { // accepted while Close ran: it would not be closed
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.handle(c)
	}
}

// Close stops the GPUs (clients see the device gone), closes connections
// and removes the socket and the control nodes.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	var errs []error
	if s.ln != nil {
		errs = append(errs, s.ln.Close())
	}
	s.wg.Wait()
	for _, g := range s.gpus {
		g.stop()
	}
	for _, n := range s.nodes {
		errs = append(errs, ignoreNotExist(os.Remove(n)))
	}
	errs = append(errs, ignoreNotExist(os.Remove(s.socket)))
	return errors.Join(errs...)
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

type request struct {
	op, gpu          uint32
	arg0, arg1, arg2 uint64
	// tsgAt is, for opCtxCreate, when the client allocated the context's
	// channel group (CLOCK_MONOTONIC ns; 0: unknown).
	tsgAt int64
	// deadline is, for opRMControl, when the sender stops waiting
	// (CLOCK_MONOTONIC ns; 0: never): a control read later is not made.
	deadline int64
}

type response struct {
	status           int32
	val0, val1, val2 uint64
}

func (r response) bytes() []byte {
	b := make([]byte, respSize)
	binary.LittleEndian.PutUint32(b[0:], uint32(r.status))
	binary.LittleEndian.PutUint64(b[8:], r.val0)
	binary.LittleEndian.PutUint64(b[16:], r.val1)
	binary.LittleEndian.PutUint64(b[24:], r.val2)
	return b
}

// peerCred returns the connected process's pid and uid.
func peerCred(c *net.UnixConn) (pid int, uid uint32) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, ^uint32(0)
	}
	uid = ^uint32(0)
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid, uid = int(cred.Pid), cred.Uid
		}
	})
	return pid, uid
}

// cgroupOf returns the cgroup v2 path of pid, "" when unknown.
func cgroupOf(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return rest
		}
	}
	return ""
}

// conn is one client connection's state: its contexts and, once it said
// hello, its RM client and the control file that client is bound to.
type conn struct {
	c      *net.UnixConn
	pid    int
	uid    uint32
	ctxs   map[uint64]*gpuContext
	client uint32
	file   int // -1: none
}

func (s *Server) handle(c *net.UnixConn) {
	defer s.wg.Done()
	cn := &conn{c: c, ctxs: map[uint64]*gpuContext{}, file: -1}
	cn.pid, cn.uid = peerCred(c)
	defer func() {
		for _, x := range cn.ctxs {
			x.gpu.removeContext(x)
		}
		if cn.file >= 0 {
			s.reg.unbind(cn.client, cn.file)
			unix.Close(cn.file)
		}
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	for {
		req, fds, err := readRequest(c)
		if err != nil {
			return
		}
		switch req.op {
		case opHello:
			err = s.hello(cn, req, fds)
		case opCtxCreate:
			closeAll(fds)
			err = s.createContext(c, req, cn.pid, cn.ctxs)
		case opStats:
			closeAll(fds)
			err = s.sendStats(c, req.arg0 == 1)
		case opRMControl:
			err = s.rmControl(cn, req, fds)
		default:
			closeAll(fds)
			_, err = c.Write(s.simple(req, cn.ctxs).bytes())
		}
		if err != nil {
			return
		}
	}
}

// readRequest reads one fixed-size request and the file descriptors sent
// with it (SCM_RIGHTS).
func readRequest(c *net.UnixConn) (request, []int, error) {
	buf := make([]byte, reqSize)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var fds []int
	for got := 0; got < reqSize; {
		n, oobn, _, _, err := c.ReadMsgUnix(buf[got:], oob)
		if oobn > 0 {
			if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
				for _, m := range msgs {
					if rights, rerr := unix.ParseUnixRights(&m); rerr == nil {
						fds = append(fds, rights...)
					}
				}
			}
		}
		if err != nil || n == 0 {
			closeAll(fds)
			if err == nil {
				err = io.EOF
			}
			return request{}, nil, err
		}
		got += n
	}
	le := binary.LittleEndian
	return request{op: le.Uint32(buf[0:]), gpu: le.Uint32(buf[4:]),
		arg0: le.Uint64(buf[8:]), arg1: le.Uint64(buf[16:]), arg2: le.Uint64(buf[24:]), tsgAt: int64(le.Uint64(buf[32:])),
		deadline: int64(le.Uint64(buf[40:]))}, fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// hello answers a client's hello and binds its RM client to the control
// file it sent, as the driver binds a client to the file it was
// allocated on.
func (s *Server) hello(cn *conn, req request, fds []int) error {
	if len(fds) > 0 && req.arg0 != 0 && cn.file < 0 {
		cn.client, cn.file = uint32(req.arg0), fds[0]
		s.reg.bind(cn.client, cn.file)
		fds = fds[1:]
	}
	closeAll(fds)
	_, err := cn.c.Write(s.simple(req, cn.ctxs).bytes())
	return err
}

func (s *Server) createContext(c *net.UnixConn, req request, pid int, ctxs map[uint64]*gpuContext) error {
	if int(req.gpu) >= len(s.gpus) {
		_, err := c.Write(response{status: cudaInvalidDevice}.bytes())
		return err
	}
	g := s.gpus[req.gpu]
	id := s.nextCtx.Add(1)
	x, err := g.addContext(id, pid, cgroupOf(pid), uint32(req.arg0), uint32(req.arg1), uint32(req.arg2), req.tsgAt)
	if err != nil {
		_, werr := c.Write(response{status: cudaOutOfMemory}.bytes())
		return werr
	}
	ctxs[id] = x
	oob := unix.UnixRights(x.fd, g.dbFD)
	_, _, err = c.WriteMsgUnix(response{val0: id, val1: s.driverTimeslice()}.bytes(), oob, nil)
	return err
}

// driverTimeslice is the timeslice (µs) the driver's libcuda sets on a new
// context's channel group, in the realism's turn; 0 leaves the default.
func (s *Server) driverTimeslice() uint64 {
	ts := s.cfg.Realism.DriverTimeslices
	if len(ts) == 0 {
		return 0
	}
	n := s.driverSlices.Add(1) - 1
	return uint64(ts[n%uint64(len(ts))] / time.Microsecond)
}

func (s *Server) simple(req request, ctxs map[uint64]*gpuContext) response {
	switch req.op {
	case opHello:
		return response{val0: uint64(len(s.gpus)), val1: s.cfg.Memory, val2: s.cfg.CopyBandwidth}
	case opCtxDestroy:
		x, ok := ctxs[req.arg0]
		if !ok {
			return response{status: cudaInvalidContext}
		}
		delete(ctxs, req.arg0)
		x.gpu.removeContext(x)
		return response{}
	case opMemAlloc:
		x, ok := ctxs[req.arg0]
		if !ok {
			return response{status: cudaInvalidContext}
		}
		return x.gpu.alloc(x, req.arg1)
	case opMemFree:
		x, ok := ctxs[req.arg0]
		if !ok {
			return response{status: cudaInvalidContext}
		}
		return x.gpu.free(x, req.arg1)
	case opChannel:
		x, ok := ctxs[req.arg0]
		if !ok || req.arg1 >= MaxChannels {
			return response{status: cudaInvalidValue}
		}
		x.gpu.mu.Lock()
		x.chans[req.arg1].handle = uint32(req.arg2)
		x.gpu.mu.Unlock()
		return response{}
	}
	return response{status: cudaInvalidValue}
}

const allocAlign = 2 << 20

func (g *gpu) alloc(c *gpuContext, bytes uint64) response {
	if bytes == 0 {
		return response{status: cudaInvalidValue}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !c.alive {
		return response{status: cudaInvalidContext}
	}
	if bytes > g.cfg.Memory-g.memUsed {
		return response{status: cudaOutOfMemory}
	}
	addr := g.nextAddr
	g.nextAddr += (bytes + allocAlign - 1) / allocAlign * allocAlign
	g.memUsed += bytes
	c.memBytes += bytes
	c.allocs[addr] = bytes
	return response{val0: addr}
}

func (g *gpu) free(c *gpuContext, addr uint64) response {
	g.mu.Lock()
	defer g.mu.Unlock()
	bytes, ok := c.allocs[addr]
	if !ok {
		return response{status: cudaInvalidValue}
	}
	delete(c.allocs, addr)
	g.memUsed -= bytes
	c.memBytes -= bytes
	g.reg.forget(addr, bytes)
	return response{val0: bytes}
}

// Stats is the ground truth fakegpud reports (fakegpud stats --json).
type Stats struct {
	GPUs      []GPUStats `json:"gpus"`
	ElapsedNS uint64     `json:"elapsed_ns"`
	NowNS     int64      `json:"now_ns"`
}

// GPUStats is one GPU's ground truth.
type GPUStats struct {
	Index      int            `json:"index"`
	BusyNS     uint64         `json:"busy_ns"`
	CopyBusyNS uint64         `json:"copy_busy_ns"`
	MemUsed    uint64         `json:"mem_used"`
	Contexts   []ContextStats `json:"contexts"`
}

// ContextStats is one context's ground truth: GPU time it actually got.
type ContextStats struct {
	ID       uint64 `json:"id"`
	PID      int    `json:"pid"`
	Cgroup   string `json:"cgroup"`
	BusyNS   uint64 `json:"busy_ns"`
	Kernels  uint64 `json:"kernels"`
	CopyNS   uint64 `json:"copy_ns"`
	Copies   uint64 `json:"copies"`
	QueueNS  uint64 `json:"queue_ns"`
	MemBytes uint64 `json:"mem_bytes"`
	Alive    bool   `json:"alive"`
	// The RM handles its libcuda allocated the channel group under, and
	// the group's timeslice.
	Client      uint32   `json:"client"`
	TSG         uint32   `json:"tsg"`
	Subdevice   uint32   `json:"subdevice"`
	Channels    []uint32 `json:"channels,omitempty"` // RM handles of its channels
	TimesliceUS uint64   `json:"timeslice_us"`
	// Disabled counts its channels taken off the runlist.
	Disabled int `json:"disabled,omitempty"`
}

// Snapshot returns the ground truth; reset zeroes it afterwards and drops
// destroyed contexts.
func (s *Server) Snapshot(reset bool) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st Stats
	for _, g := range s.gpus {
		g.mu.Lock()
		now := g.catchUp()
		if st.NowNS == 0 {
			// The window ends where the first GPU was caught up; the
			// others are caught up microseconds later.
			st.NowNS = now
			st.ElapsedNS = uint64(now - s.resetAt)
			if reset {
				s.resetAt = now
			}
		}
		gs := GPUStats{Index: g.index, BusyNS: g.busyNS, CopyBusyNS: g.copyBusyNS, MemUsed: g.memUsed, Contexts: []ContextStats{}}
		all := append(append([]*gpuContext(nil), g.ctxs...), g.ended...)
		for _, c := range all {
			cg := c.cgroup
			if c.alive {
				if now := cgroupOf(c.pid); now != "" {
					cg = now // processes move between cgroups
				}
			}
			cs := ContextStats{ID: c.id, PID: c.pid, Cgroup: cg, BusyNS: c.busyNS,
				Kernels: c.kernels, CopyNS: c.copyNS, Copies: c.copies, QueueNS: c.queueNS, MemBytes: c.memBytes, Alive: c.alive,
				Client: c.client, TSG: c.tsg, Subdevice: c.subdevice, TimesliceUS: uint64(c.slice() / int64(time.Microsecond))}
			for _, ch := range c.chans {
				if ch.handle != 0 {
					cs.Channels = append(cs.Channels, ch.handle)
				}
				if ch.disabled {
					cs.Disabled++
				}
			}
			gs.Contexts = append(gs.Contexts, cs)
			if reset {
				c.busyNS, c.kernels, c.copyNS, c.copies, c.queueNS = 0, 0, 0, 0, 0
			}
		}
		if reset {
			g.busyNS, g.copyBusyNS = 0, 0
			g.ended = nil
		}
		g.mu.Unlock()
		st.GPUs = append(st.GPUs, gs)
	}
	return st
}

func (s *Server) sendStats(c *net.UnixConn, reset bool) error {
	data, err := json.Marshal(s.Snapshot(reset))
	if err != nil {
		return err
	}
	if _, err := c.Write(response{val0: uint64(len(data))}.bytes()); err != nil {
		return err
	}
	_, err = c.Write(data)
	return err
}
