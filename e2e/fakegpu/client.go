package fakegpu

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"
)

// maxStatsBytes bounds the stats answer a client accepts.
const maxStatsBytes = 64 << 20

// ReadStats asks a running fakegpud for its ground truth (and resets it).
func ReadStats(socket string, reset bool) (Stats, error) {
	if socket == "" {
		socket = DefaultSocket
	}
	c, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		return Stats{}, fmt.Errorf("connect to fakegpud at %s: %w", socket, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := make([]byte, reqSize)
	binary.LittleEndian.PutUint32(req[0:], opStats)
	if reset {
		binary.LittleEndian.PutUint64(req[8:], 1)
	}
	if _, err := c.Write(req); err != nil {
		return Stats{}, fmt.Errorf("stats request: %w", err)
	}
	resp := make([]byte, respSize)
	if _, err := io.ReadFull(c, resp); err != nil {
		return Stats{}, fmt.Errorf("stats response: %w", err)
	}
	n := binary.LittleEndian.Uint64(resp[8:])
	if n > maxStatsBytes {
		return Stats{}, fmt.Errorf("stats response: %d bytes is too large", n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(c, data); err != nil {
		return Stats{}, fmt.Errorf("stats response: %w", err)
	}
	var st Stats
	if err := json.Unmarshal(data, &st); err != nil {
		return Stats{}, fmt.Errorf("decode stats: %w", err)
	}
	return st, nil
}
