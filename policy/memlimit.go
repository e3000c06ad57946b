package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// MemoryLimit is a GPU memory limit on each GPU: an amount of memory, a
// share of each GPU's memory, or both, where the lower holds. The zero
// value is no limit.
type MemoryLimit struct {
	Bytes Bytes
	// Share is of each GPU's memory as the driver reports it, in (0, 1];
	// 0: none.
	Share float64
}

// memShareBoth joins a share and an amount in a limit that has both.
const memShareBoth = " up to "

// IsZero tells that m limits nothing.
func (m MemoryLimit) IsZero() bool { return m == MemoryLimit{} }

// On is the limit in bytes on a GPU of gpuBytes (0: its size is unknown,
// and a share holds nothing there); 0 is none.
func (m MemoryLimit) On(gpuBytes uint64) uint64 {
	if m.Share == 0 || gpuBytes == 0 {
		return uint64(m.Bytes)
	}
	of := max(uint64(float64(gpuBytes)*m.Share), 1)
	if m.Bytes != 0 && uint64(m.Bytes) < of {
		return uint64(m.Bytes)
	}
	return of
}

// ParseMemoryLimit reads a GPU memory limit: an amount (16GiB, as
// ParseBytes), a percentage of each GPU's memory (50%), or both (50% up to
// 16GiB).
func ParseMemoryLimit(s string) (MemoryLimit, error) {
	s = strings.TrimSpace(s)
	pct, amount, both := strings.Cut(s, memShareBoth)
	if !both {
		if !strings.HasSuffix(s, "%") {
			b, err := ParseBytes(s)
			return MemoryLimit{Bytes: b}, err
		}
		pct = s
	}
	p, ok := strings.CutSuffix(strings.TrimSpace(pct), "%")
	v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
	// !(in range), not (out of range): NaN fails every comparison.
	if !ok || err != nil || !(v > 0 && v <= 100) {
		return MemoryLimit{}, fmt.Errorf("%q: want an amount (16GiB), a percentage of each GPU's memory in (0%%, 100%%] (50%%), or both (50%% up to 16GiB)", s)
	}
	m := MemoryLimit{Share: v / 100}
	if both {
		if m.Bytes, err = ParseBytes(amount); err != nil {
			return MemoryLimit{}, err
		}
	}
	return m, nil
}

// String renders m as ParseMemoryLimit reads it.
func (m MemoryLimit) String() string {
	if m.Share == 0 {
		return m.Bytes.String()
	}
	// Parts per million: the probes' precision.
	pct := strconv.FormatFloat(math.Round(m.Share*1e6)/1e4, 'f', -1, 64) + "%"
	if m.Bytes == 0 {
		return pct
	}
	return pct + memShareBoth + m.Bytes.String()
}

// within is m held to bound: each part bound sets (an amount, a share)
// that m lacks or exceeds is bound's. Since the lower of a limit's parts
// holds on each GPU, the result is never above bound on any GPU.
func (m MemoryLimit) within(bound MemoryLimit) MemoryLimit {
	if bound.Bytes != 0 && (m.Bytes == 0 || m.Bytes > bound.Bytes) {
		m.Bytes = bound.Bytes
	}
	if bound.Share != 0 && (m.Share == 0 || m.Share > bound.Share) {
		m.Share = bound.Share
	}
	return m
}

// validate checks m's amount and share.
func (m MemoryLimit) validate() error {
	if m.Bytes != 0 && m.Bytes < MinMemoryLimit {
		return fmt.Errorf("%s is below the smallest limit, %s (a CUDA context alone holds more)", m.Bytes, MinMemoryLimit)
	}
	if m.Share != 0 && !(m.Share > 0 && m.Share <= 1) {
		return fmt.Errorf("a share of %g is out of (0%%, 100%%]", m.Share*100)
	}
	return nil
}

// UnmarshalYAML accepts what ParseMemoryLimit reads.
func (m *MemoryLimit) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseMemoryLimit(n.Value)
	if err != nil {
		return lineError(n, "", err.Error())
	}
	*m = v
	return nil
}

// MarshalYAML writes an amount alone as bytes, anything else as a string.
func (m MemoryLimit) MarshalYAML() (any, error) {
	if m.Share == 0 {
		return uint64(m.Bytes), nil
	}
	return m.String(), nil
}

// MarshalJSON writes an amount alone as a number of bytes (as clients of
// an amount alone always read it), anything else as a string.
func (m MemoryLimit) MarshalJSON() ([]byte, error) {
	if m.Share == 0 {
		return json.Marshal(uint64(m.Bytes))
	}
	return json.Marshal(m.String())
}

// UnmarshalJSON accepts a number of bytes or what ParseMemoryLimit reads.
func (m *MemoryLimit) UnmarshalJSON(b []byte) error {
	var n uint64
	if err := json.Unmarshal(b, &n); err == nil {
		*m = MemoryLimit{Bytes: Bytes(n)}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("memory limit: want a number of bytes or a string: %w", err)
	}
	v, err := ParseMemoryLimit(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}
