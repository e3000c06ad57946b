package testutil

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuarb/gpuarb/lab"
)

// ContainerdBin is where scripts/install-deps.sh --test builds the NRI
// test's containerd 2.x and crictl.
const ContainerdBin = "/opt/gpuarb-test/bin"

// Images the private containerd has, both the busybox rootfs lab.NewRunc
// builds (fully qualified: CRI's image cache resolves short names apart).
const (
	PauseImage   = "registry.k8s.io/pause:3.10"
	BusyboxImage = "docker.io/library/busybox:local"
)

// Containerd is a containerd of the test's own: root, state, API and NRI
// sockets under a test directory, CRI on its defaults but for what this
// host needs, driven with crictl.
type Containerd struct {
	Dir       string
	Socket    string // CRI/containerd API
	NRISocket string
	// Version is what `containerd --version` says.
	Version string
	// Nofile is its RLIMIT_NOFILE, which its containers inherit when
	// nothing sets one for them.
	Nofile uint64
	proc   *Proc
	bin    string // where its containerd and ctr are
	conf   string // its config.toml
	// owner is the test that started it, which ends it at cleanup
	// whichever test restarted it.
	owner testing.TB
}

// StartContainerd starts a private containerd 2.x (of ContainerdBin) on
// its defaults, NRI on, with the busybox images imported, stopped (its pods
// removed first) at cleanup. Without the binaries of ContainerdBin the test
// skips, or fails under CI=true.
func StartContainerd(t testing.TB) *Containerd {
	t.Helper()
	requireBins(t, ContainerdBin, "scripts/install-deps.sh --test builds it", "containerd", "containerd-shim-runc-v2", "ctr")
	// restrict_oom_score_adj: a VM without CAP_SYS_RESOURCE cannot lower
	// it. No CNI: the tests' pods use the host's network.
	return startContainerd(t, ContainerdBin, func(c *Containerd) string {
		return "version = 3\n" + c.privatePaths() + fmt.Sprintf(`[plugins.'io.containerd.nri.v1.nri']
  socket_path = %q
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %q
`, c.NRISocket, PauseImage)
	})
}

// StartContainerd1 starts a private containerd 1.x of the host's (Debian's
// containerd package) whose runc handler starts every container from the
// base runtime spec baseSpec and passes the pods' gpuarb.io/* annotations
// (pod_annotations), as docs/deploy.md tells containerd 1.x users.
func StartContainerd1(t testing.TB, baseSpec string) *Containerd {
	t.Helper()
	requireBins(t, "/usr/bin", "apt-get install containerd", "containerd", "containerd-shim-runc-v2", "ctr")
	return startContainerd(t, "/usr/bin", func(c *Containerd) string {
		return "version = 2\n" + c.privatePaths() + fmt.Sprintf(`[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  sandbox_image = %q
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = %q
  pod_annotations = ["gpuarb.io/*"]
`, PauseImage, baseSpec)
	})
}

// privatePaths is the configuration's top: root, state and sockets in the
// private directory (the same in configuration versions 2 and 3).
func (c *Containerd) privatePaths() string {
	return fmt.Sprintf("root = %q\nstate = %q\n[grpc]\n  address = %q\n[ttrpc]\n  address = %q\n",
		filepath.Join(c.Dir, "root"), filepath.Join(c.Dir, "state"), c.Socket, c.Socket+".ttrpc")
}

// requireBins skips the test (fails it under CI=true) unless dir holds
// each of bins, and crictl is in ContainerdBin.
func requireBins(t testing.TB, dir, hint string, bins ...string) {
	t.Helper()
	Privileged(t)
	for _, b := range bins {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			Missing(t, filepath.Join(dir, b)+" ("+hint+")")
		}
	}
	if _, err := os.Stat(filepath.Join(ContainerdBin, "crictl")); err != nil {
		Missing(t, filepath.Join(ContainerdBin, "crictl")+" (scripts/install-deps.sh --test builds it)")
	}
	Require(t, "runc", "apt-get install runc")
}

// startContainerd runs binDir's containerd with the configuration conf
// makes, in a private directory, and imports the images.
func startContainerd(t testing.TB, binDir string, conf func(*Containerd) string) *Containerd {
	t.Helper()
	// The sockets' paths must fit a sockaddr_un: a short directory.
	dir, err := os.MkdirTemp("", "ctrd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	c := &Containerd{Dir: dir, Socket: filepath.Join(dir, "c.sock"), NRISocket: filepath.Join(dir, "nri.sock"), bin: binDir, owner: t}
	crictlConf := "runtime-endpoint: unix://" + c.Socket + "\nimage-endpoint: unix://" + c.Socket + "\n"
	if err := os.WriteFile(filepath.Join(dir, "crictl.yaml"), []byte(crictlConf), 0o600); err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf(c)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(binDir, "containerd"), "--version").Output()
	if err != nil {
		t.Fatalf("containerd --version: %v", err)
	}
	c.Version = strings.TrimSpace(string(out))
	c.conf = confPath
	c.run(t)
	t.Cleanup(c.stop)
	c.importImages(t)
	return c
}

// Log is containerd's log so far.
func (c *Containerd) Log() string {
	_, stderr := c.proc.Output()
	return string(stderr)
}

// Crictl runs crictl against the private containerd and returns its
// output (stderr included with an error).
func (c *Containerd) Crictl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(ContainerdBin, "crictl"), append([]string{"--config", filepath.Join(c.Dir, "crictl.yaml"), "--timeout", "20s"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// Pod is what a test sets of a pod and its one container.
type Pod struct {
	Name        string
	Annotations map[string]string
	// CgroupParent is the pod's cgroup (cgroupfs form), below the test's.
	CgroupParent string
	Args         []string
	// GPU mounts the built binaries at /gpuarb-bin and the simulated
	// GPU's socket directory at /gpu, with FAKEGPU_SOCKET set.
	GPU *FakeGPU
}

// RunPod creates pod p and starts its container (crictl runp, create,
// start), returning the pod's and the container's ids; the pod is
// stopped and removed at cleanup.
func (c *Containerd) RunPod(t testing.TB, p Pod) (podID, ctrID string, err error) {
	t.Helper()
	podCfg := map[string]any{
		"metadata":      map[string]any{"name": p.Name, "namespace": "gpuarb-e2e", "uid": "uid-" + p.Name},
		"annotations":   p.Annotations,
		"log_directory": filepath.Join(c.Dir, "logs", p.Name),
		"linux": map[string]any{
			"cgroup_parent":    p.CgroupParent,
			"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}},
		},
	}
	ctrCfg := c.containerConfig(t, p, "work")
	podFile, ctrFile := filepath.Join(c.Dir, p.Name+"-pod.json"), filepath.Join(c.Dir, p.Name+"-ctr.json")
	for f, v := range map[string]any{podFile: podCfg, ctrFile: ctrCfg} {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(c.Dir, "logs", p.Name), 0o755); err != nil {
		t.Fatal(err)
	}
	podID, err = c.Crictl("runp", podFile)
	if err != nil {
		return "", "", err
	}
	t.Cleanup(func() {
		if _, err := c.Crictl("stopp", podID); err != nil {
			t.Errorf("stop pod %s: %v", p.Name, err)
		}
		if _, err := c.Crictl("rmp", podID); err != nil {
			t.Errorf("remove pod %s: %v", p.Name, err)
		}
	})
	ctrID, err = c.Crictl("create", podID, ctrFile, podFile)
	if err != nil {
		return podID, "", err
	}
	_, err = c.Crictl("start", ctrID)
	return podID, ctrID, err
}

// AddContainer starts one more container, named name, in pod p (run by
// RunPod as podID) with args, and returns its id.
func (c *Containerd) AddContainer(t testing.TB, p Pod, podID, name string, args []string) (string, error) {
	t.Helper()
	p.Args = args
	data, err := json.Marshal(c.containerConfig(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	ctrFile := filepath.Join(c.Dir, p.Name+"-"+name+"-ctr.json")
	if err := os.WriteFile(ctrFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := c.Crictl("create", podID, ctrFile, filepath.Join(c.Dir, p.Name+"-pod.json"))
	if err != nil {
		return "", err
	}
	_, err = c.Crictl("start", id)
	return id, err
}

// containerConfig is the CRI config of container name of pod p.
func (c *Containerd) containerConfig(t testing.TB, p Pod, name string) map[string]any {
	t.Helper()
	ctrCfg := map[string]any{
		"metadata": map[string]any{"name": name},
		"image":    map[string]any{"image": BusyboxImage},
		"command":  p.Args,
		"log_path": name + ".log",
	}
	if p.GPU != nil {
		ro := func(host, ctr string) map[string]any {
			return map[string]any{"host_path": host, "container_path": ctr, "readonly": true}
		}
		ctrCfg["mounts"] = []any{ro(filepath.Dir(Bin(t, "gpuwork")), "/gpuarb-bin"), ro("/lib", "/lib"), ro("/lib64", "/lib64"), ro("/usr/lib", "/usr/lib"),
			map[string]any{"host_path": filepath.Dir(p.GPU.Socket), "container_path": "/gpu"}}
		ctrCfg["envs"] = []any{map[string]any{"key": "FAKEGPU_SOCKET", "value": "/gpu/" + filepath.Base(p.GPU.Socket)}}
	}
	return ctrCfg
}

// run starts containerd and waits until it answers.
func (c *Containerd) run(t testing.TB) {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.bin, "containerd"), "--config", c.conf)
	// Its shim is the one beside it.
	cmd.Env = append(os.Environ(), "PATH="+c.bin+":"+os.Getenv("PATH"))
	c.proc = Start(c.owner, nil, cmd)
	// A file limit of its own that its pods inherit unless a base
	// runtime spec sets one: below the test's (raising it needs
	// CAP_SYS_RESOURCE), and never the 1024 a base spec sets.
	var own unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &own); err != nil {
		t.Fatal(err)
	}
	c.Nofile = min(own.Max, 54321)
	if c.Nofile == 1024 {
		c.Nofile = 1000
	}
	lim := unix.Rlimit{Cur: c.Nofile, Max: c.Nofile}
	if err := unix.Prlimit(c.proc.Cmd.Process.Pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatalf("containerd's file limit: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := c.Crictl("info"); err == nil {
			break
		}
		if time.Now().After(deadline) || c.proc.Done() {
			_, stderr := c.proc.Output()
			t.Fatalf("containerd did not answer within 20 s:\n%s", tail([]byte(stderr), 4000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Restart stops containerd (SIGINT, as systemd's stop) and starts it
// again, as an upgrade does: its containers keep running (their shims
// outlive it), and its NRI plugins must connect again.
func (c *Containerd) Restart(t testing.TB) {
	t.Helper()
	c.proc.Interrupt(10 * time.Second)
	c.run(t)
}

// stop removes every pod left and ends containerd.
func (c *Containerd) stop() {
	if ids, err := c.Crictl("pods", "-q"); err == nil {
		for _, id := range strings.Fields(ids) {
			_, _ = c.Crictl("stopp", id)
			_, _ = c.Crictl("rmp", id)
		}
	}
	c.proc.Stop()
}

// importImages imports an OCI archive of the busybox rootfs under both
// image names.
func (c *Containerd) importImages(t testing.TB) {
	t.Helper()
	Require(t, "busybox", "apt-get install busybox-static")
	r, err := lab.NewRunc(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(c.Dir, "images.tar")
	if err := writeImageArchive(archive, r.Rootfs, map[string][]string{
		PauseImage:   {"/bin/sleep", "2147483647"},
		BusyboxImage: {"/bin/sh"},
	}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(c.bin, "ctr"), "--address", c.Socket, "-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images import: %v: %s", err, out)
	}
}

// writeImageArchive writes an OCI image archive of rootfs as one layer,
// one image per name with its command.
func writeImageArchive(path, rootfs string, images map[string][]string) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	err := filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == rootfs {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if d.Type()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(rootfs, p)
		hdr.Name = rel
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return fmt.Errorf("image layer: %w", err)
	}
	blobs := map[string][]byte{}
	add := func(data []byte) (digest string) {
		sum := sha256.Sum256(data)
		digest = "sha256:" + hex.EncodeToString(sum[:])
		blobs[digest] = data
		return digest
	}
	desc := func(mediaType string, data []byte, ann map[string]string) map[string]any {
		d := map[string]any{"mediaType": mediaType, "digest": add(data), "size": len(data)}
		if ann != nil {
			d["annotations"] = ann
		}
		return d
	}
	layerDesc := desc("application/vnd.oci.image.layer.v1.tar", layer.Bytes(), nil)
	var manifests []any
	for name, cmd := range images {
		cfg, _ := json.Marshal(map[string]any{
			"architecture": "amd64", "os": "linux",
			"config": map[string]any{"Cmd": cmd, "Env": []string{"PATH=/bin"}},
			"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc["digest"].(string)}},
		})
		man, _ := json.Marshal(map[string]any{
			"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
			"config": desc("application/vnd.oci.image.config.v1+json", cfg, nil),
			"layers": []any{layerDesc},
		})
		manifests = append(manifests, desc("application/vnd.oci.image.manifest.v1+json", man,
			map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}))
	}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests})
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("image archive: %w", err)
	}
	defer f.Close()
	aw := tar.NewWriter(f)
	put := func(name string, data []byte) error {
		if err := aw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := aw.Write(data)
		return err
	}
	err = put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	if err == nil {
		err = put("index.json", index)
	}
	for digest, data := range blobs {
		if err == nil {
			err = put("blobs/sha256/"+strings.TrimPrefix(digest, "sha256:"), data)
		}
	}
	if err == nil {
		err = aw.Close()
	}
	if err != nil {
		return fmt.Errorf("image archive: %w", err)
	}
	return f.Close()
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
