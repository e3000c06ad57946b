package gpusched

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/nvrm"
)

// Ownership is what the driver's ownership rule answers for one channel
// group (docs/driver.md §3): the same harmless control (GET_INFO on
// the group) sent through a duplicate of the process's own control file
// and through a file this process opened itself.
type Ownership struct {
	// Node is the control file's path as the process sees it, Major and
	// Minor its device numbers (the nvidia driver's control node: 195:255).
	Node         string `json:"node"`
	Major, Minor uint32
	// Driver is the transport the duplicate reached: nvidia or the
	// simulated GPU.
	Driver string `json:"driver"`
	// ViaDuplicate and ViaFresh are the NV_STATUS answered through the
	// duplicate (0 expected) and through the fresh file (0x23,
	// NV_ERR_INVALID_CLIENT, expected: a client is bound to its file).
	ViaDuplicate uint32 `json:"via_duplicate"`
	ViaFresh     uint32 `json:"via_fresh"`
	// TSGID is the group's hardware ID as GET_INFO answers it.
	TSGID uint32 `json:"tsg_id"`
}

// CheckOwnership duplicates group g's control file with pidfd_getfd and
// sends GET_INFO through it and through a fresh open of the same node (its
// very inode, reopened: never a path the process shows). An error means a
// step failed before the driver could answer.
func (a *Actuator) CheckOwnership(g Group) (Ownership, error) {
	pidfd, err := unix.PidfdOpen(int(g.PID), 0)
	if err != nil {
		return Ownership{}, fmt.Errorf("pid %d: pidfd_open: %w", g.PID, err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, int(g.FD), 0)
	if err != nil {
		return Ownership{}, fmt.Errorf("pid %d: pidfd_getfd of descriptor %d: %w", g.PID, g.FD, err)
	}
	dup := os.NewFile(uintptr(fd), fmt.Sprintf("pid %d fd %d", g.PID, g.FD))
	defer dup.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Ownership{}, fmt.Errorf("pid %d: fstat of its control file: %w", g.PID, err)
	}
	node, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", g.PID, g.FD))
	if err != nil {
		return Ownership{}, fmt.Errorf("pid %d: control file %d: %w", g.PID, g.FD, err)
	}
	o := Ownership{Node: node, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}
	via, err := a.transportOf(g, dup)
	if err != nil {
		return o, err
	}
	defer via.close()
	o.Driver = via.String()
	info := make([]byte, 4)
	if o.ViaDuplicate, err = via.control(dup, g.Client, g.TSG, nvrm.CtrlTSGGetInfo, info); err != nil {
		return o, fmt.Errorf("GET_INFO through the duplicate: %w", err)
	}
	o.TSGID = binary.LittleEndian.Uint32(info)
	fresh, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDWR, 0)
	if err != nil {
		return o, fmt.Errorf("open %s afresh: %w", node, err)
	}
	defer fresh.Close()
	if o.ViaFresh, err = via.control(fresh, g.Client, g.TSG, nvrm.CtrlTSGGetInfo, make([]byte, 4)); err != nil {
		return o, fmt.Errorf("GET_INFO through a fresh file: %w", err)
	}
	return o, nil
}
