// Command icl-devicemanager drives the kubelet's own device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) without a kubelet and
// without a container runtime, for the kube-icl e2e tests.
//
// It serves the device-plugin Registration service on <plugin-dir>/kubelet.sock
// (the real plugin server of the device manager), waits until a plugin for
// -resource has registered and reported healthy devices, then, for each pod
// named in -pods, reads the pod from the API server and admits each container
// that asks for the resource through ManagerImpl.Allocate: the same code path
// the kubelet's admission handler runs (available = healthy - in use, ask the
// plugin's GetPreferredAllocation, Allocate). It prints one JSON line per
// container with the devices the manager recorded and the container runtime
// options (environment) the plugin returned.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	_ "unsafe" // go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// newManagerImpl is the device manager's own constructor with a socket path:
// NewManagerImpl hard-codes /var/lib/kubelet/device-plugins/kubelet.sock, and
// the package's tests use this one with a temporary directory.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, store topologymanager.Store) (*devicemanager.ManagerImpl, error)

type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

type result struct {
	Pod       string            `json:"pod"`
	Container string            `json:"container"`
	Resource  string            `json:"resource"`
	Devices   []string          `json:"devices"`
	Envs      map[string]string `json:"envs"`
	Error     string            `json:"error,omitempty"`
}

func main() {
	pluginDir := flag.String("plugin-dir", "", "directory of kubelet.sock and the plugins' sockets")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server the pods are read from")
	namespace := flag.String("namespace", "default", "namespace of the pods")
	pods := flag.String("pods", "", "comma-separated pod names, admitted in this order")
	resource := flag.String("resource", "kube-icl.io/accelerator", "extended resource")
	timeout := flag.Duration("timeout", 60*time.Second, "how long to wait for the plugin to register")
	flag.Parse()
	if err := run(*pluginDir, *kubeconfig, *namespace, *pods, *resource, *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "icl-devicemanager: %v\n", err)
		os.Exit(1)
	}
}

func run(pluginDir, kubeconfig, namespace, podNames, resource string, timeout time.Duration) error {
	if pluginDir == "" || kubeconfig == "" || podNames == "" {
		return fmt.Errorf("-plugin-dir, -kubeconfig and -pods are required")
	}
	logger := klog.Background()
	ctx := klog.NewContext(context.Background(), logger)
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	manager, err := newManagerImpl(logger, filepath.Join(pluginDir, "kubelet.sock"), nil, topologymanager.NewFakeManager(logger))
	if err != nil {
		return fmt.Errorf("device manager: %w", err)
	}
	var admitted []*v1.Pod
	active := func() []*v1.Pod { return admitted }
	if err := manager.Start(logger, active, allReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("device manager start: %w", err)
	}
	defer func() { _ = manager.Stop(logger) }()
	fmt.Printf("{\"listening\": %q}\n", filepath.Join(pluginDir, "kubelet.sock"))
	deadline := time.Now().Add(timeout)
	for {
		_, allocatable, _ := manager.GetCapacity(logger)
		if q, ok := allocatable[v1.ResourceName(resource)]; ok && !q.IsZero() {
			fmt.Printf("{\"registered\": %q, \"allocatable\": %d}\n", resource, q.Value())
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no plugin registered healthy devices of %s within %s", resource, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	out := json.NewEncoder(os.Stdout)
	for _, name := range strings.Split(podNames, ",") {
		pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		}
		admitted = append(admitted, pod)
		for i := range pod.Spec.Containers {
			container := &pod.Spec.Containers[i]
			if _, asks := container.Resources.Limits[v1.ResourceName(resource)]; !asks {
				continue
			}
			r := result{Pod: name, Container: container.Name, Resource: resource, Envs: map[string]string{}}
			if err := manager.Allocate(ctx, pod, container, lifecycle.AddOperation); err != nil {
				r.Error = err.Error()
			} else {
				for id := range manager.GetDevices(string(pod.UID), container.Name)[resource] {
					r.Devices = append(r.Devices, id)
				}
				sort.Strings(r.Devices)
				opts, err := manager.GetDeviceRunContainerOptions(ctx, pod, container)
				if err != nil {
					r.Error = err.Error()
				} else if opts != nil {
					for _, env := range opts.Envs {
						r.Envs[env.Name] = env.Value
					}
				}
			}
			if err := out.Encode(r); err != nil {
				return err
			}
		}
	}
	return nil
}
