// dmharness runs the kubelet's own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager)
// without the rest of the kubelet, so that the kubelet tier can drive our Python device plugin
// through the real registration server, ListAndWatch client, GetPreferredAllocation and
// Allocate logic. It is a test shim, not shipped.
//
// The calls whose signatures differ between Kubernetes minors (contextual logging in v1.36)
// live in compat_v1.<minor>.go; the build takes the newest one not newer than the pinned minor.
//
// It serves /var/lib/kubelet/device-plugins/kubelet.sock (the path is hard-coded in the
// kubelet) and reads one JSON command per line on stdin, answering one JSON line on stdout:
//
//	{"op":"capacity"}                         -> {"capacity":{...},"allocatable":{...}}
//	{"op":"allocate","pod":{...v1.Pod...},"container":"c"}
//	                                          -> {"envs":{...},"mounts":[...],"cdi_devices":[...],
//	                                              "devices":[...]} or {"error":"..."}
//	{"op":"forget","uids":["..."]}            -> {"ok":true}   (those pods, or all without uids, are gone)
//	{"op":"restart"}                          -> {"ok":true}   (a kubelet restart: the folder is wiped)
//	{"op":"quit"}
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
)

type command struct {
	Op        string   `json:"op"`
	Pod       *v1.Pod  `json:"pod"`
	Container string   `json:"container"`
	UIDs      []string `json:"uids"`
}

type harness struct {
	mu      sync.Mutex
	manager *devicemanager.ManagerImpl
	pods    []*v1.Pod
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*v1.Pod(nil), h.pods...)
}

func (h *harness) start() error {
	m, err := newManager()
	if err != nil {
		return err
	}
	ready := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := startManager(m, h.activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return err
	}
	h.manager = m
	return nil
}

func (h *harness) handle(c command) map[string]any {
	switch c.Op {
	case "capacity":
		capacity, allocatable := managerCapacity(h.manager)
		return map[string]any{"capacity": capacity, "allocatable": allocatable}
	case "allocate":
		if c.Pod == nil {
			return map[string]any{"error": "allocate needs pod"}
		}
		var container *v1.Container
		for i := range c.Pod.Spec.InitContainers {
			if c.Pod.Spec.InitContainers[i].Name == c.Container {
				container = &c.Pod.Spec.InitContainers[i]
			}
		}
		for i := range c.Pod.Spec.Containers {
			if c.Pod.Spec.Containers[i].Name == c.Container {
				container = &c.Pod.Spec.Containers[i]
			}
		}
		if container == nil {
			return map[string]any{"error": fmt.Sprintf("pod has no container %q", c.Container)}
		}
		h.mu.Lock()
		h.pods = append(h.pods, c.Pod)
		h.mu.Unlock()
		if err := allocate(h.manager, c.Pod, container); err != nil {
			return map[string]any{"error": err.Error()}
		}
		opts, err := runOptions(h.manager, c.Pod, container)
		if err != nil {
			return map[string]any{"error": err.Error()}
		}
		envs := map[string]string{}
		mounts := []map[string]any{}
		cdi := []string{}
		if opts != nil {
			for _, e := range opts.Envs {
				envs[e.Name] = e.Value
			}
			for _, m := range opts.Mounts {
				mounts = append(mounts, map[string]any{
					"container_path": m.ContainerPath, "host_path": m.HostPath, "read_only": m.ReadOnly,
				})
			}
			for _, d := range opts.CDIDevices {
				cdi = append(cdi, d.Name)
			}
		}
		devices := h.manager.GetDevices(string(c.Pod.UID), c.Container)
		ids := []string{}
		for _, instances := range devices {
			for id := range instances {
				ids = append(ids, id)
			}
		}
		return map[string]any{"envs": envs, "mounts": mounts, "cdi_devices": cdi, "devices": ids}
	case "forget":
		// Pods deleted from the API server stop being active, as in the kubelet; the device
		// manager frees their devices at its next Allocate.
		gone := sets.New[string](c.UIDs...)
		h.mu.Lock()
		kept := h.pods[:0]
		for _, p := range h.pods {
			if c.UIDs != nil && !gone.Has(string(p.UID)) {
				kept = append(kept, p)
			}
		}
		h.pods = kept
		h.mu.Unlock()
		return map[string]any{"ok": true}
	case "restart":
		if err := stopManager(h.manager); err != nil {
			return map[string]any{"error": err.Error()}
		}
		if err := h.start(); err != nil {
			return map[string]any{"error": err.Error()}
		}
		return map[string]any{"ok": true}
	}
	return map[string]any{"error": fmt.Sprintf("unknown op %q", c.Op)}
}

func main() {
	h := &harness{}
	if err := h.start(); err != nil {
		fmt.Fprintln(os.Stderr, "dmharness: cannot start the device manager:", err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{"ready": true})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var c command
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			_ = out.Encode(map[string]any{"error": "bad command: " + err.Error()})
			continue
		}
		if c.Op == "quit" {
			break
		}
		_ = out.Encode(h.handle(c))
	}
	_ = stopManager(h.manager)
}
