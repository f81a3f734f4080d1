// The device manager's calls as Kubernetes v1.37 spells them: a logger or a context first
// everywhere, and Allocate says which pod operation it serves.
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
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
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
	logger := klog.Background()
	return devicemanager.NewManagerImpl(logger, nil, topologymanager.NewFakeManager(logger))
}

func managerCapacity(m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList) {
	capacity, allocatable, _ := m.GetCapacity(klog.Background())
	return capacity, allocatable
}

func allocate(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) error {
	return m.Allocate(context.Background(), pod, c, lifecycle.AddOperation)
}
