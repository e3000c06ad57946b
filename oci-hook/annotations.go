package ocihook

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuarb/gpuarb/policy"
)

// The annotations the hook reads. Kubernetes pod annotations reach the
// runtime spec (CRI-O and containerd copy them), so a pod takes its policy
// from its manifest.
const (
	AnnotationName      = "gpuarb.io/name"       // tenant name (default: the container id)
	AnnotationWeight    = "gpuarb.io/weight"     // 1–10000
	AnnotationLimit     = "gpuarb.io/limit"      // "30%" or 0.3
	AnnotationPriority  = "gpuarb.io/priority"   // latency | normal | batch
	AnnotationSLOP99MS  = "gpuarb.io/slo-p99-ms" // latency tenants: p99 sync wait bound
	AnnotationSLOFPS    = "gpuarb.io/slo-fps"    // latency tenants: frame rate to hold
	annotationKeyPrefix = "gpuarb.io/"
)

var knownAnnotations = map[string]bool{
	AnnotationName: true, AnnotationWeight: true, AnnotationLimit: true, AnnotationPriority: true,
	AnnotationSLOP99MS: true, AnnotationSLOFPS: true,
}

// AnnotationError names the annotation whose value is invalid.
type AnnotationError struct {
	Key, Value, Msg string
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("annotation %s=%q: %s", e.Key, e.Value, e.Msg)
}

// RulesFromAnnotations turns gpuarb.io/* annotations into policy rules;
// what they leave out stays unset (the daemon's defaults apply). An SLO
// without a priority makes the tenant a latency tenant.
func RulesFromAnnotations(a map[string]string) (policy.Rules, error) {
	var r policy.Rules
	for k, v := range a {
		if strings.HasPrefix(k, annotationKeyPrefix) && !knownAnnotations[k] {
			return r, &AnnotationError{k, v, "unknown gpuarb annotation (known: name, weight, limit, priority, slo-p99-ms, slo-fps)"}
		}
	}
	if v, ok := a[AnnotationName]; ok {
		if v == "" || strings.ContainsAny(v, " \t\n/") || len(v) > 128 {
			return r, &AnnotationError{AnnotationName, v, "must be 1–128 characters without spaces or '/'"}
		}
	}
	if v, ok := a[AnnotationWeight]; ok {
		w, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || w < policy.MinWeight || w > policy.MaxWeight {
			return r, &AnnotationError{AnnotationWeight, v, fmt.Sprintf("want an integer %d–%d", policy.MinWeight, policy.MaxWeight)}
		}
		r.Weight = policy.Weight(w)
	}
	if v, ok := a[AnnotationLimit]; ok {
		s, err := policy.ParseShare(v)
		if err != nil || s <= 0 || s > 1 {
			return r, &AnnotationError{AnnotationLimit, v, "want a share in (0, 1] as 0.3 or 30%"}
		}
		r.Limit = s
	}
	if v, ok := a[AnnotationPriority]; ok {
		p := policy.Priority(strings.TrimSpace(v))
		switch p {
		case policy.Latency, policy.Normal, policy.Batch:
			r.Priority = p
		default:
			return r, &AnnotationError{AnnotationPriority, v, "want latency, normal or batch"}
		}
	}
	slo := func(key string, max float64) (float64, error) {
		v, ok := a[key]
		if !ok {
			return 0, nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || f <= 0 || f > max {
			return 0, &AnnotationError{key, v, fmt.Sprintf("want a number in (0, %g]", max)}
		}
		return f, nil
	}
	var err error
	if r.SLO.P99SyncMS, err = slo(AnnotationSLOP99MS, 60000); err != nil {
		return r, err
	}
	if r.SLO.FPS, err = slo(AnnotationSLOFPS, 1000); err != nil {
		return r, err
	}
	if r.SLO.P99SyncMS > 0 && r.SLO.FPS > 0 {
		return r, &AnnotationError{AnnotationSLOFPS, a[AnnotationSLOFPS], "set " + AnnotationSLOP99MS + " or " + AnnotationSLOFPS + ", not both"}
	}
	if r.SLO.P99SyncMS > 0 || r.SLO.FPS > 0 {
		switch r.Priority {
		case "":
			r.Priority = policy.Latency
		case policy.Latency:
		default:
			return r, &AnnotationError{AnnotationPriority, a[AnnotationPriority], "an SLO needs priority latency"}
		}
	}
	return r, nil
}
