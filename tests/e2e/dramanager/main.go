// Command icl-dramanager drives the kubelet's own DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra) and plugin manager
// (k8s.io/kubernetes/pkg/kubelet/pluginmanager) without a kubelet and without a
// container runtime, for the kube-icl e2e tests.
//
// It watches -registry-dir like the kubelet's plugin watcher, so a DRA driver
// registers through its real pluginregistration socket (GetInfo, then
// NotifyRegistrationStatus); then it reads -pod from the API server and runs
// Manager.PrepareResources on it (the kubelet's path before it starts a pod: read
// each ResourceClaim, check it is reserved for the pod, call the driver's
// NodePrepareResources), prints one JSON line per container with the CDI devices
// Manager.GetResources gives the container runtime, and with -unprepare runs
// Manager.UnprepareResources (NodeUnprepareResources) and prints a last line.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

type line struct {
	Pod        string   `json:"pod"`
	Container  string   `json:"container,omitempty"`
	CDIDevices []string `json:"cdiDevices"`
	Unprepared bool     `json:"unprepared,omitempty"`
}

func main() {
	registryDir := flag.String("registry-dir", "", "the plugin-registration directory the kubelet watches")
	stateDir := flag.String("state-dir", "", "where the DRA manager keeps its checkpoint")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	node := flag.String("node", "", "this node's name")
	namespace := flag.String("namespace", "default", "namespace of the pod")
	pod := flag.String("pod", "", "the pod to prepare")
	unprepare := flag.Bool("unprepare", false, "unprepare the pod's claims afterwards")
	timeout := flag.Duration("timeout", 60*time.Second, "how long to wait for the driver to register")
	flag.Parse()
	if err := run(*registryDir, *stateDir, *kubeconfig, *node, *namespace, *pod, *unprepare, *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "icl-dramanager: %v\n", err)
		os.Exit(1)
	}
}

func run(registryDir, stateDir, kubeconfig, node, namespace, podName string, unprepare bool, timeout time.Duration) error {
	if registryDir == "" || stateDir == "" || kubeconfig == "" || node == "" || podName == "" {
		return fmt.Errorf("-registry-dir, -state-dir, -kubeconfig, -node and -pod are required")
	}
	logger := klog.Background()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	manager, err := dra.NewManager(logger, client, stateDir)
	if err != nil {
		return err
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	}
	activePods := func() []*v1.Pod { return []*v1.Pod{pod} }
	if err := manager.Start(ctx, activePods, getNode, allReady{}); err != nil {
		return err
	}
	defer manager.Stop()
	plugins := pluginmanager.NewPluginManager(registryDir, &record.FakeRecorder{})
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, manager.GetWatcherHandler())
	stop := make(chan struct{})
	defer close(stop)
	go plugins.Run(ctx, allReady{}, stop)

	// Until the driver has registered, PrepareResources fails naming the driver: retry until the deadline.
	deadline := time.Now().Add(timeout)
	for {
		err = manager.PrepareResources(ctx, pod)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || !strings.Contains(err.Error(), "not registered") {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	out := json.NewEncoder(os.Stdout)
	for i := range pod.Spec.Containers {
		info, err := manager.GetResources(pod, &pod.Spec.Containers[i])
		if err != nil {
			return err
		}
		ids := []string{}
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		if err := out.Encode(line{Pod: pod.Name, Container: pod.Spec.Containers[i].Name, CDIDevices: ids}); err != nil {
			return err
		}
	}
	if unprepare {
		if err := manager.UnprepareResources(ctx, pod); err != nil {
			return err
		}
		return out.Encode(line{Pod: pod.Name, CDIDevices: []string{}, Unprepared: true})
	}
	return nil
}
