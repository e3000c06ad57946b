package classify

import "testing"

// A default tenant is labelled by its container's short id, its systemd
// unit, or its path.
func TestLabel(t *testing.T) {
	id := "4f3c2b1a0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a"
	for in, want := range map[string]string{
		"/docker/" + id:                         "4f3c2b1a0d9e",
		"/system.slice/docker-" + id + ".scope": "4f3c2b1a0d9e",
		"/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope": "4f3c2b1a0d9e",
		"/machine.slice/libpod-" + id + ".scope":                              "4f3c2b1a0d9e",
		"/kubepods/besteffort/pod1/" + id:                                     "4f3c2b1a0d9e",
		"/user.slice/user-1000.slice/session-2.scope":                         "session-2.scope",
		"/gpuarb-test/a": "/gpuarb-test/a",
		"/":              "/",
		"":               "?",
	} {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
}

// Pod cgroups are those under the kubelet's kubepods, in either driver's
// form.
func TestPodCgroup(t *testing.T) {
	for in, want := range map[string]bool{
		"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope": true,
		"/kubepods/burstable/pod1/abc":                true,
		"/kubepods/pod1/abc":                          true,
		"/system.slice/docker-abc.scope":              false,
		"/gpuarb-test/kubepods-like/x":                false,
		"/user.slice/user-1000.slice/session-2.scope": false,
	} {
		if got := PodCgroup(in); got != want {
			t.Errorf("PodCgroup(%q) = %v, want %v", in, got, want)
		}
	}
}
