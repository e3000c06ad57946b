package policy

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The keys RulesFromStrings reads: what OCI annotations (gpuarb.io/KEY)
// and libvirt metadata attributes (<gpuarb:policy KEY=...>) spell.
const (
	KeyWeight   = "weight"     // 1–10000
	KeyLimit    = "limit"      // "30%" or 0.3
	KeyPriority = "priority"   // latency | normal | batch
	KeySLOP99MS = "slo-p99-ms" // latency tenants: p99 sync wait bound
	KeySLOFPS   = "slo-fps"    // latency tenants: frame rate to hold
	// KeyMemoryLimit is the GPU memory limit per GPU: "16GiB", bytes, or
	// a share of each GPU's memory, "50%".
	KeyMemoryLimit = "memory-limit"
)

// ValueError names the key whose value is invalid.
type ValueError struct {
	Key, Value, Msg string
	// Unknown is set when the key itself is not one RulesFromStrings reads.
	Unknown bool
}

func (e *ValueError) Error() string {
	return fmt.Sprintf("%s=%q: %s", e.Key, e.Value, e.Msg)
}

// RulesFromStrings turns key=value pairs into rules; what they leave out
// stays unset (the daemon's defaults apply). An SLO without a priority
// makes the tenant a latency tenant. Unknown keys are errors.
func RulesFromStrings(kv map[string]string) (Rules, error) {
	var r Rules
	for k, v := range kv {
		switch k {
		case KeyWeight, KeyLimit, KeyPriority, KeySLOP99MS, KeySLOFPS, KeyMemoryLimit:
		default:
			return r, &ValueError{Key: k, Value: v, Msg: "unknown key (known: weight, limit, priority, slo-p99-ms, slo-fps, memory-limit)", Unknown: true}
		}
	}
	if v, ok := kv[KeyWeight]; ok {
		w, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || w < MinWeight || w > MaxWeight {
			return r, &ValueError{Key: KeyWeight, Value: v, Msg: fmt.Sprintf("want an integer %d–%d", MinWeight, MaxWeight)}
		}
		r.Weight = Weight(w)
	}
	if v, ok := kv[KeyLimit]; ok {
		s, err := ParseShare(v)
		// !(in range), not (out of range): NaN fails every comparison.
		if err != nil || !(s > 0 && s <= 1) {
			return r, &ValueError{Key: KeyLimit, Value: v, Msg: "want a share in (0, 1] as 0.3 or 30%"}
		}
		r.Limit = s
	}
	if v, ok := kv[KeyMemoryLimit]; ok {
		m, err := ParseMemoryLimit(v)
		if err == nil {
			err = m.validate()
		}
		if err == nil && m.IsZero() {
			err = fmt.Errorf("0 is no limit: leave the key out")
		}
		if err != nil {
			return r, &ValueError{Key: KeyMemoryLimit, Value: v, Msg: err.Error()}
		}
		r.MemoryLimit = m
	}
	if v, ok := kv[KeyPriority]; ok {
		p := Priority(strings.TrimSpace(v))
		switch p {
		case Latency, Normal, Batch:
			r.Priority = p
		default:
			return r, &ValueError{Key: KeyPriority, Value: v, Msg: "want latency, normal or batch"}
		}
	}
	slo := func(key string, max float64) (float64, error) {
		v, ok := kv[key]
		if !ok {
			return 0, nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || !(f > 0 && f <= max) {
			return 0, &ValueError{Key: key, Value: v, Msg: fmt.Sprintf("want a number in (0, %g]", max)}
		}
		return f, nil
	}
	var err error
	if r.SLO.P99SyncMS, err = slo(KeySLOP99MS, 60000); err != nil {
		return r, err
	}
	if r.SLO.FPS, err = slo(KeySLOFPS, 1000); err != nil {
		return r, err
	}
	if r.SLO.P99SyncMS > 0 && r.SLO.FPS > 0 {
		return r, &ValueError{Key: KeySLOFPS, Value: kv[KeySLOFPS], Msg: "set " + KeySLOP99MS + " or " + KeySLOFPS + ", not both"}
	}
	if r.SLO.P99SyncMS > 0 || r.SLO.FPS > 0 {
		switch r.Priority {
		case "":
			r.Priority = Latency
		case Latency:
		default:
			return r, &ValueError{Key: KeyPriority, Value: kv[KeyPriority], Msg: "an SLO needs priority latency"}
		}
	}
	return r, nil
}

// CheckTenantName fails unless s can name a tenant: 1–128 printable
// characters without spaces or '/'.
func CheckTenantName(s string) error {
	// Names reach operators' terminals (top, trace): printable UTF-8 only.
	bad := func(r rune) bool { return r == ' ' || r == '/' || r == utf8.RuneError || !unicode.IsPrint(r) }
	if s == "" || strings.IndexFunc(s, bad) >= 0 || len(s) > 128 {
		return fmt.Errorf("%q must be 1–128 printable characters without spaces or '/'", s)
	}
	return nil
}
