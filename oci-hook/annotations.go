package ocihook

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpuarb/gpuarb/policy"
)

// The annotations the hook and the NRI plugin read. NRI hands the plugin
// every pod annotation; CRI-O copies them into the runtime spec the hook
// reads, but containerd only those its runtime handler lists in
// pod_annotations (none by default).
const (
	AnnotationName      = "gpuarb.io/name" // tenant name (default: the container id)
	AnnotationWeight    = annotationKeyPrefix + policy.KeyWeight
	AnnotationLimit     = annotationKeyPrefix + policy.KeyLimit
	AnnotationPriority  = annotationKeyPrefix + policy.KeyPriority
	AnnotationSLOP99MS  = annotationKeyPrefix + policy.KeySLOP99MS
	AnnotationSLOFPS    = annotationKeyPrefix + policy.KeySLOFPS
	AnnotationMemLimit  = annotationKeyPrefix + policy.KeyMemoryLimit
	annotationKeyPrefix = "gpuarb.io/"
)

// AnnotationError names the annotation whose value is invalid.
type AnnotationError struct {
	Key, Value, Msg string
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("annotation %s=%q: %s", e.Key, e.Value, e.Msg)
}

// RulesFromAnnotations turns gpuarb.io/* annotations into policy rules
// (policy.RulesFromStrings on the keys without their prefix); errors name
// the annotation.
func RulesFromAnnotations(a map[string]string) (policy.Rules, error) {
	kv := map[string]string{}
	for k, v := range a {
		key, ok := strings.CutPrefix(k, annotationKeyPrefix)
		if !ok {
			continue
		}
		if k == AnnotationName {
			if err := policy.CheckTenantName(v); err != nil {
				return policy.Rules{}, &AnnotationError{k, v, "must be 1–128 printable characters without spaces or '/'"}
			}
			continue
		}
		kv[key] = v
	}
	r, err := policy.RulesFromStrings(kv)
	var ve *policy.ValueError
	if errors.As(err, &ve) {
		msg := ve.Msg
		if ve.Unknown {
			msg = "unknown gpuarb annotation (known: name, weight, limit, priority, slo-p99-ms, slo-fps, memory-limit)"
		}
		return r, &AnnotationError{annotationKeyPrefix + ve.Key, ve.Value, msg}
	}
	return r, err
}
