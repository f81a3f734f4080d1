// The device manager's calls as Kubernetes v1.35 and v1.36 spell them (a logger or a context first).
package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
)

func startManager(m *devicemanager.ManagerImpl, active devicemanager.ActivePodsFunc, ready config.SourcesReady,
	cm containermap.ContainerMap, running sets.Set[string]) error {
	return m.Start(klog.Background(), active, ready, cm, running)
}

func runOptions(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return m.GetDeviceRunContainerOptions(context.Background(), pod, c)
}

func stopManager(m *devicemanager.ManagerImpl) error { return m.Stop(klog.Background()) }

func newManager() (*devicemanager.ManagerImpl, error) {
	return devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
}

func managerCapacity(m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList) {
	capacity, allocatable, _ := m.GetCapacity()
	return capacity, allocatable
}

func allocate(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) error {
	return m.Allocate(pod, c)
}
