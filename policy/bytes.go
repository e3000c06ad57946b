package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Bytes is an amount of memory in bytes; 0 means unset.
type Bytes uint64

// byteUnits are the suffixes ParseBytes reads: binary (Ki, KiB ...) as
// Kubernetes quantities and nvidia-smi spell them, and decimal (K, KB ...).
var byteUnits = map[string]uint64{
	"": 1, "B": 1,
	"K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
	"Ki": 1 << 10, "KiB": 1 << 10, "Mi": 1 << 20, "MiB": 1 << 20, "Gi": 1 << 30, "GiB": 1 << 30, "Ti": 1 << 40, "TiB": 1 << 40,
}

// ParseBytes reads an amount of memory: a whole number of bytes, or a
// number with a unit (1GiB, 512Mi, 1.5G, 80GB).
func ParseBytes(s string) (Bytes, error) {
	s = strings.TrimSpace(s)
	if strings.HasSuffix(s, "%") {
		return 0, fmt.Errorf("%q: a share of the GPU's memory is not supported: give bytes with a unit (16GiB)", s)
	}
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = s[:i], strings.TrimSpace(s[i:])
	}
	mult, ok := byteUnits[unit]
	v, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || num == "" {
		return 0, fmt.Errorf("%q is not an amount of memory (bytes, or a number with a unit: KiB MiB GiB TiB, KB MB GB TB)", s)
	}
	b := v * float64(mult)
	// !(b < max), not (b >= max): NaN fails every comparison.
	if !(b < math.MaxInt64) {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return Bytes(math.Round(b)), nil
}

// String renders b in the largest binary unit that divides it.
func (b Bytes) String() string {
	for _, u := range []string{"TiB", "GiB", "MiB", "KiB"} {
		if m := byteUnits[u]; uint64(b) >= m && uint64(b)%m == 0 {
			return fmt.Sprintf("%d%s", uint64(b)/m, u)
		}
	}
	return strconv.FormatUint(uint64(b), 10)
}

// UnmarshalYAML accepts a number of bytes or an amount with a unit.
func (b *Bytes) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseBytes(n.Value)
	if err != nil {
		return lineError(n, "", err.Error())
	}
	*b = v
	return nil
}
