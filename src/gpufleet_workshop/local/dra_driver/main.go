// Command gpufleet-dra-driver is the local real node's DRA driver for the
// GPUs of its fixture node: a kubelet plugin on
// k8s.io/dynamic-resource-allocation/kubeletplugin that publishes one
// ResourceSlice pool for the node (driver gpu.nvidia.com, one device per
// GPU, as NVIDIA's DRA driver publishes them) and answers the kubelet's
// NodePrepareResources and NodeUnprepareResources calls.
//
// The devices come from a JSON file (a list of resource.k8s.io/v1 Device
// objects) that gpufleet_workshop.local.dra writes from the fixture node,
// the same description kwok nodes' ResourceSlices are built from, so the
// attributes have one owner. There is no GPU here: preparing a claim
// records which devices it was given in a checkpoint file (the kubelet may
// ask again after a restart, and unprepare must know what prepare did) and
// hands the container runtime no CDI device (containerd 1.6 has no CDI).
//
// Flags: --node-name, --kubeconfig (the kubelet's: the Node authorizer lets a
// node write its own ResourceSlices and read the claims of its pods),
// --devices, --kubelet-root (the kubelet's --root-dir: plugins_registry/ and
// plugins/<driver>/ live there), --state (the checkpoint file).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// DriverName is NVIDIA's DRA driver name for full GPUs.
const DriverName = "gpu.nvidia.com"

// preparedClaim is what the checkpoint keeps of one prepared claim.
type preparedClaim struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Devices   []string `json:"devices"`
}

// driver implements kubeletplugin.DRAPlugin over a checkpoint file.
type driver struct {
	mu       sync.Mutex
	state    string
	known    map[string]bool
	prepared map[types.UID]preparedClaim
	cancel   context.CancelCauseFunc
}

func (d *driver) load() error {
	d.prepared = map[types.UID]preparedClaim{}
	data, err := os.ReadFile(d.state)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &d.prepared); err != nil {
		return fmt.Errorf("checkpoint %s: %w", d.state, err)
	}
	return nil
}

// save writes the checkpoint atomically (a crash leaves the old or the new one).
func (d *driver) save() error {
	data, err := json.MarshalIndent(d.prepared, "", " ")
	if err != nil {
		return err
	}
	tmp := d.state + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, d.state)
}

// PrepareResourceClaims records the devices allocated to each claim from this driver's pool.
func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	logger := klog.FromContext(ctx)
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var result kubeletplugin.PrepareResult
		var names []string
		if claim.Status.Allocation == nil {
			result.Err = fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
			out[claim.UID] = result
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != DriverName {
				continue
			}
			if !d.known[r.Device] {
				result.Err = fmt.Errorf("claim %s/%s: device %s is not one of this node's GPUs", claim.Namespace, claim.Name, r.Device)
				break
			}
			result.Devices = append(result.Devices, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			})
			names = append(names, r.Device)
		}
		if result.Err == nil {
			// The last line of defence against two claims on one GPU.
			for uid, other := range d.prepared {
				if uid == claim.UID {
					continue
				}
				for _, used := range other.Devices {
					for _, n := range names {
						if used == n {
							result.Err = fmt.Errorf("claim %s/%s: device %s is prepared for claim %s/%s", claim.Namespace, claim.Name, n, other.Namespace, other.Name)
						}
					}
				}
			}
		}
		if result.Err == nil {
			sort.Strings(names)
			d.prepared[claim.UID] = preparedClaim{Namespace: claim.Namespace, Name: claim.Name, Devices: names}
			logger.Info("Prepared claim", "claim", klog.KObj(claim), "devices", names)
		}
		out[claim.UID] = result
	}
	return out, d.save()
}

// UnprepareResourceClaims forgets each claim (idempotent: an unknown claim is not an error).
func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	logger := klog.FromContext(ctx)
	out := map[types.UID]error{}
	for _, claim := range claims {
		if was, ok := d.prepared[claim.UID]; ok {
			delete(d.prepared, claim.UID)
			logger.Info("Unprepared claim", "claim", claim.String(), "devices", was.Devices)
		}
		out[claim.UID] = nil
	}
	return out, d.save()
}

// HandleError logs background errors; one that retrying cannot fix stops the driver.
func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("fatal background error: %w", err))
	}
}

// WatchHealthStatus: no device health stream (gpufleet's node health watches the GPUs).
func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func main() {
	klog.InitFlags(nil)
	nodeName := flag.String("node-name", "", "this node's name")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig (the kubelet's)")
	devicesFile := flag.String("devices", "", "JSON list of resource.k8s.io/v1 Device objects to publish")
	kubeletRoot := flag.String("kubelet-root", "/var/lib/kubelet", "the kubelet's --root-dir")
	stateFile := flag.String("state", "", "checkpoint of prepared claims (default <plugin dir>/checkpoint.json)")
	flag.Parse()
	if err := run(*nodeName, *kubeconfig, *devicesFile, *kubeletRoot, *stateFile); err != nil {
		fmt.Fprintln(os.Stderr, "gpufleet-dra-driver:", err)
		os.Exit(1)
	}
}

func run(nodeName, kubeconfig, devicesFile, kubeletRoot, stateFile string) error {
	if nodeName == "" || devicesFile == "" {
		return errors.New("--node-name and --devices are required")
	}
	var devices []resourceapi.Device
	data, err := os.ReadFile(devicesFile)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &devices); err != nil {
		return fmt.Errorf("--devices %s: expected a JSON list of resource.k8s.io/v1 Device objects: %w", devicesFile, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	pluginDir := filepath.Join(kubeletRoot, "plugins", DriverName)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	registryDir := filepath.Join(kubeletRoot, "plugins_registry")
	if err := os.MkdirAll(registryDir, 0o750); err != nil {
		return err
	}
	if stateFile == "" {
		stateFile = filepath.Join(pluginDir, "checkpoint.json")
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() { s := <-signals; cancel(fmt.Errorf("signal %v", s)) }()

	d := &driver{state: stateFile, known: map[string]bool{}, cancel: cancel}
	for _, dev := range devices {
		d.known[dev.Name] = true
	}
	if err := d.load(); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	// One pool named after the node, one slice with every GPU (NVIDIA's driver does the same).
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	klog.InfoS("Serving", "driver", DriverName, "node", nodeName, "devices", len(devices), "pluginDir", pluginDir)
	<-ctx.Done()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		klog.InfoS("Stopping", "cause", cause.Error())
	}
	return nil
}
