package gpusched

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// transport delivers an RM control to the driver through a duplicate of a
// process's control file: the file that process's RM client is bound to.
type transport interface {
	control(file *os.File, client, object, cmd uint32, params []byte) (status uint32, err error)
	// slices are the timeslices its GPU runs channel groups well at;
	// timeslice reads the probed group's own.
	slices(timeslice func() (time.Duration, error)) (Slices, error)
	String() string
}

// Slices are the timeslices a GPU runs its channel groups well at: Base,
// what a group runs with unless gpuarb changes it (its switches cost no
// more than the driver's own choice does), and Min, the shortest whose
// switches still leave most of the GPU to the work.
type Slices struct{ Base, Min time.Duration }

// nvidiaMinSlice is the shortest timeslice on the nvidia driver. The
// real-GPU check (e2e/realgpu/report.md: H200, driver 580, three
// saturating processes all at one timeslice) kept, of the throughput at
// their default 2048 µs, 1.004 at 4096 µs, 0.905 at 1024, 0.751 at 512,
// 0.44 at 200 and 0.18 at 100: a channel-group switch costs about 250 µs.
// At 1024 µs one group at the floor beside one at 9× its slice loses
// about 5% of the GPU to switches.
const nvidiaMinSlice = 1024 * time.Microsecond

// nvidiaBaseSlice is the least base slice on the nvidia driver: 2048 µs
// lost nothing against 4096 µs on the check's H200, 1024 µs lost 9.5%.
// CUDA's contexts there read 2048 µs once busy (the check's ownership
// step) and 1024 µs when the daemon probed a fresh one (its arbitration
// step), so the read alone cannot be the base.
const nvidiaBaseSlice = 2048 * time.Microsecond

// fakeSlices are the simulated GPU's: its default timeslice, and its floor
// for SET_TIMESLICE (a switch costs it 20 µs; e2e/fakegpu).
var fakeSlices = Slices{Base: 1024 * time.Microsecond, Min: 100 * time.Microsecond}

// nvidia is the real driver: NV_ESC_RM_CONTROL on the duplicate.
type nvidia struct{}

// slices: Base is the probed group's own timeslice where a process or
// the driver set it longer, else nvidiaBaseSlice; Min nvidiaMinSlice.
func (nvidia) slices(timeslice func() (time.Duration, error)) (Slices, error) {
	ts, err := timeslice()
	if err != nil {
		return Slices{}, fmt.Errorf("read the driver's timeslice: %w", err)
	}
	return Slices{Base: max(ts, nvidiaBaseSlice), Min: nvidiaMinSlice}, nil
}

// nvos54 is NVOS54_PARAMETERS, RM_CONTROL's argument.
type nvos54 struct {
	Client, Object, Cmd, Flags uint32
	Params                     uint64
	ParamsSize, Status         uint32
}

// rmControlIoctl is _IOWR('F', 0x2A, sizeof(NVOS54_PARAMETERS) = 32).
const rmControlIoctl = 0xC020462A

func (nvidia) String() string { return "nvidia" }

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
type fakeGPU struct{ socket string }

// The simulator's setup protocol (e2e/fakegpu/libcuda/fakegpu_abi.h).
const (
	fakeOpRMControl = 8
	fakeReqSize     = 64
	fakeRespSize    = 32
	fakeMaxParams   = 1024
)

func (f fakeGPU) String() string { return "fakegpu " + f.socket }

// slices are fakeSlices: read back, a group's timeslice would depend on
// which context was probed (the realism's libcuda sets 2048 µs on every
// other one).
func (fakeGPU) slices(func() (time.Duration, error)) (Slices, error) { return fakeSlices, nil }

func (f fakeGPU) control(file *os.File, client, object, cmd uint32, params []byte) (uint32, error) {
	if len(params) > fakeMaxParams {
		return 0, fmt.Errorf("rm control 0x%08x: %d bytes of params", cmd, len(params))
	}
	c, err := net.DialTimeout("unix", f.socket, time.Second)
	if err != nil {
		return 0, fmt.Errorf("rm control 0x%08x: simulated GPU at %s: %w", cmd, f.socket, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	req := make([]byte, fakeReqSize, fakeReqSize+len(params))
	le := binary.LittleEndian
	le.PutUint32(req[0:], fakeOpRMControl)
	le.PutUint32(req[4:], uint32(len(params)))
	le.PutUint64(req[8:], uint64(client))
	le.PutUint64(req[16:], uint64(object))
	le.PutUint64(req[24:], uint64(cmd))
	uc := c.(*net.UnixConn)
	if _, _, err := uc.WriteMsgUnix(append(req, params...), unix.UnixRights(int(file.Fd())), nil); err != nil {
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
