package gpusched

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/nvrm"
)

// transport delivers an RM control to the driver through a duplicate of a
// process's control file: the file that process's RM client is bound to.
type transport interface {
	control(file *os.File, client, object, cmd uint32, params []byte) (status uint32, err error)
	// slices are the timeslices its GPU runs channel groups well at;
	// control makes an RM control on the probed group.
	slices(control func(cmd uint32, params []byte) error) (Slices, error)
	String() string
	// close releases what the transport holds beside the file.
	close()
}

// Slices are the timeslices a GPU runs its channel groups well at: Base,
// what a group runs with unless gpuarb changes it (its switches cost no
// more than the driver's own choice does), and Min, the shortest whose
// switches still leave most of the GPU to the work.
type Slices struct{ Base, Min time.Duration }

// slicesFor are the timeslices of a GPU whose channel-group switch costs
// sw and whose groups run at def unless told otherwise: the floor is 4 sw
// (a group held there loses a fifth of its turn to its switch), never
// below minFloor; the base 8 sw (a ninth), never below def. On the real-GPU
// check's H200 (e2e/realgpu/report.md: three saturating processes all at
// one timeslice) 2048 µs, 8 switches, kept the throughput of 4096 µs,
// 1024 µs kept 0.905 of it, 512 µs 0.751, 200 µs 0.44 and 100 µs 0.18.
func slicesFor(sw, def time.Duration) Slices {
	floor := max(4*sw, minFloor)
	return Slices{Base: max(8*sw, def, floor), Min: floor}
}

// minFloor is the shortest floor of any GPU: shorter slices gained the
// fuzzer's latency-held loops nothing on the simulated GPU
// (docs/benchmark-history.md §10).
const minFloor = 100 * time.Microsecond

// nvidiaSwitch is what a channel-group switch costs on the nvidia driver:
// the real-GPU check's H200 lost to switches what 240–254 µs each explain
// at slices of 1024 and 512 µs (more at shorter ones), between processes
// of 40 ms matrix multiplies.
const nvidiaSwitch = 256 * time.Microsecond

// nvidia is the real driver: NV_ESC_RM_CONTROL on the duplicate.
type nvidia struct{}

// slices are slicesFor nvidiaSwitch and the probed group's own timeslice.
// CUDA's contexts on the check's H200 read 2048 µs once busy and 1024 µs
// when the daemon probed a fresh one, so the group's own only lengthens
// the base.
func (nvidia) slices(control func(cmd uint32, params []byte) error) (Slices, error) {
	p := make([]byte, 8)
	if err := control(nvrm.CtrlTSGGetTimeslice, p); err != nil {
		return Slices{}, fmt.Errorf("read the driver's timeslice: %w", err)
	}
	return slicesFor(nvidiaSwitch, time.Duration(binary.LittleEndian.Uint64(p))*time.Microsecond), nil
}

// nvos54 is NVOS54_PARAMETERS, RM_CONTROL's argument.
type nvos54 struct {
	Client, Object, Cmd, Flags uint32
	Params                     uint64
	ParamsSize, Status         uint32
}

// rmControlIoctl is _IOWR('F', RM_CONTROL, sizeof(NVOS54_PARAMETERS)):
// 0xC020462A.
const rmControlIoctl = 3<<30 | unsafe.Sizeof(nvos54{})<<16 | nvrm.Magic<<8 | nvrm.EscRMControl

func (nvidia) String() string { return "nvidia" }

func (nvidia) close() {}

func (nvidia) control(file *os.File, client, object, cmd uint32, params []byte) (uint32, error) {
	if len(params) == 0 {
		return 0, errors.New("rm control without params")
	}
	p := nvos54{Client: client, Object: object, Cmd: cmd, Params: uint64(uintptr(unsafe.Pointer(&params[0]))),
		ParamsSize: uint32(len(params))}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, file.Fd(), rmControlIoctl, uintptr(unsafe.Pointer(&p)))
	runtime.KeepAlive(params)
	if errno != 0 {
		return 0, fmt.Errorf("rm control 0x%08x: ioctl: %w", cmd, errno)
	}
	return p.Status, nil
}

// fakeGPU is the simulated GPU: the control goes over its setup socket
// (the one boundary a host without a GPU cannot have) with the duplicate
// attached, and the simulator checks it is the file the client is bound
// to, as the driver does.
type fakeGPU struct {
	socket string
	// conn is kept from one control to the next: a dial for each took
	// about 200 µs here, three of them (a hold's two pauses and the
	// runlist restart) more than a switch costs, where the driver's
	// ioctl takes microseconds.
	mu   sync.Mutex
	conn *net.UnixConn
}

// fakeControlWait is how long a control waits for the simulator.
const fakeControlWait = 2 * time.Second

// The simulator's setup protocol (e2e/fakegpu/libcuda/fakegpu_abi.h).
const (
	fakeOpRMControl = 8
	fakeReqSize     = 64
	fakeRespSize    = 32
	fakeMaxParams   = 16 << 10
)

func (f *fakeGPU) String() string { return "fakegpu " + f.socket }

// slices are slicesFor the simulator's own switch cost and default
// timeslice, as it tells them (ctrlSimSchedCosts): a group's timeslice
// read back would depend on which context was probed (the realism's
// libcuda sets 2048 µs on every other one).
func (*fakeGPU) slices(control func(cmd uint32, params []byte) error) (Slices, error) {
	p := make([]byte, 24)
	if err := control(ctrlSimSchedCosts, p); err != nil {
		return Slices{}, fmt.Errorf("read the simulated GPU's costs: %w", err)
	}
	le := binary.LittleEndian
	return slicesFor(time.Duration(le.Uint64(p[8:])), time.Duration(le.Uint64(p))*time.Microsecond), nil
}

func (f *fakeGPU) control(file *os.File, client, object, cmd uint32, params []byte) (uint32, error) {
	if len(params) > fakeMaxParams {
		return 0, fmt.Errorf("rm control 0x%08x: %d bytes of params", cmd, len(params))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	reused := f.conn != nil
	status, err := f.roundTrip(file, client, object, cmd, params)
	if err != nil && reused {
		// The simulator may have closed an idle connection (it restarted):
		// once more on a fresh one.
		status, err = f.roundTrip(file, client, object, cmd, params)
	}
	return status, err
}

// roundTrip sends one RM control on f's connection, dialled if there is
// none, and reads the answer; a failure closes the connection. Called
// with f.mu held.
func (f *fakeGPU) roundTrip(file *os.File, client, object, cmd uint32, params []byte) (_ uint32, err error) {
	if f.conn == nil {
		c, err := net.DialTimeout("unix", f.socket, time.Second)
		if err != nil {
			return 0, fmt.Errorf("rm control 0x%08x: simulated GPU at %s: %w", cmd, f.socket, err)
		}
		f.conn = c.(*net.UnixConn)
	}
	c := f.conn
	defer func() {
		if err != nil {
			c.Close()
			f.conn = nil
		}
	}()
	_ = c.SetDeadline(time.Now().Add(fakeControlWait))
	req := make([]byte, fakeReqSize, fakeReqSize+len(params))
	le := binary.LittleEndian
	// The simulator makes no control read after this (a control is made
	// while its caller waits or not at all, as with the driver's ioctl).
	var now unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &now)
	le.PutUint64(req[40:], uint64(now.Nano()+int64(fakeControlWait)))
	le.PutUint32(req[0:], fakeOpRMControl)
	le.PutUint32(req[4:], uint32(len(params)))
	le.PutUint64(req[8:], uint64(client))
	le.PutUint64(req[16:], uint64(object))
	le.PutUint64(req[24:], uint64(cmd))
	// The file goes with every control: the simulator checks each against
	// the client's, as the driver checks the file each ioctl comes on.
	if _, _, err := c.WriteMsgUnix(append(req, params...), unix.UnixRights(int(file.Fd())), nil); err != nil {
		return 0, fmt.Errorf("rm control 0x%08x: %w", cmd, err)
	}
	runtime.KeepAlive(file)
	resp := make([]byte, fakeRespSize)
	if _, err := io.ReadFull(c, resp); err != nil {
		return 0, fmt.Errorf("rm control 0x%08x: %w", cmd, err)
	}
	n := le.Uint64(resp[8:])
	if n > fakeMaxParams {
		return 0, fmt.Errorf("rm control 0x%08x: answer of %d bytes", cmd, n)
	}
	out := make([]byte, n)
	if _, err := io.ReadFull(c, out); err != nil {
		return 0, fmt.Errorf("rm control 0x%08x: %w", cmd, err)
	}
	copy(params, out)
	return le.Uint32(resp[0:]), nil
}

// close closes f's connection.
func (f *fakeGPU) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		f.conn.Close()
		f.conn = nil
	}
}
