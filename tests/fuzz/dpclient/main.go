// dpclient plays the kubelet's side of the device plugin API v1beta1 for the fuzz tier, with the
// kubelet's own generated API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): it serves the
// Registration service on <dir>/kubelet.sock, as the kubelet does, so that a plugin started with
// --plugin-dir=<dir> registers and stays served; then it sends whatever requests the test gives
// it to the plugin's sockets with the kubelet's DevicePlugin client. Unlike the device manager
// (which only ever asks for devices it was told of), it sends any device IDs, sizes and counts
// that the wire types can carry. It is a test shim, not shipped.
//
// Usage: dpclient DIR. One JSON command per line on stdin, one JSON answer per line on stdout:
//
//	{"op":"registered"}  -> {"registered":[{"resource":"...","endpoint":"..."}]}
//	{"op":"allocate","endpoint":"x.sock","containers":[["id",...],...]}
//	{"op":"preferred","endpoint":"x.sock","containers":[{"available":[...],"must":[...],"size":N},...]}
//	{"op":"devices","endpoint":"x.sock"}  (the first ListAndWatch answer)
//	                     -> {"code":"OK"|"InvalidArgument"|...,"message":"...","response":{...}}
//	{"op":"quit"}
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type preferredRequest struct {
	Available []string `json:"available"`
	Must      []string `json:"must"`
	Size      int32    `json:"size"`
}

type command struct {
	Op         string          `json:"op"`
	Endpoint   string          `json:"endpoint"`
	Containers json.RawMessage `json:"containers"`
}

type registration struct {
	Resource string `json:"resource"`
	Endpoint string `json:"endpoint"`
}

type registry struct {
	api.UnimplementedRegistrationServer
	mu   sync.Mutex
	seen []registration
}

func (r *registry) Register(_ context.Context, req *api.RegisterRequest) (*api.Empty, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, registration{Resource: req.ResourceName, Endpoint: req.Endpoint})
	return &api.Empty{}, nil
}

type client struct {
	dir   string
	conns map[string]api.DevicePluginClient
}

func (c *client) plugin(endpoint string) (api.DevicePluginClient, error) {
	if p, ok := c.conns[endpoint]; ok {
		return p, nil
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(c.dir, endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	p := api.NewDevicePluginClient(conn)
	c.conns[endpoint] = p
	return p, nil
}

func answer(resp any, err error) map[string]any {
	if err != nil {
		s := status.Convert(err)
		return map[string]any{"code": s.Code().String(), "message": s.Message()}
	}
	return map[string]any{"code": "OK", "message": "", "response": resp}
}

func (c *client) handle(cmd command, reg *registry) map[string]any {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch cmd.Op {
	case "registered":
		reg.mu.Lock()
		defer reg.mu.Unlock()
		return map[string]any{"registered": append([]registration{}, reg.seen...)}
	case "allocate", "preferred", "devices":
	default:
		return map[string]any{"error": fmt.Sprintf("unknown op %q", cmd.Op)}
	}
	p, err := c.plugin(cmd.Endpoint)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	switch cmd.Op {
	case "allocate":
		var ids [][]string
		if err := json.Unmarshal(cmd.Containers, &ids); err != nil {
			return map[string]any{"error": err.Error()}
		}
		req := &api.AllocateRequest{}
		for _, c := range ids {
			req.ContainerRequests = append(req.ContainerRequests, &api.ContainerAllocateRequest{DevicesIds: c})
		}
		return answer(p.Allocate(ctx, req))
	case "preferred":
		var reqs []preferredRequest
		if err := json.Unmarshal(cmd.Containers, &reqs); err != nil {
			return map[string]any{"error": err.Error()}
		}
		req := &api.PreferredAllocationRequest{}
		for _, r := range reqs {
			req.ContainerRequests = append(req.ContainerRequests, &api.ContainerPreferredAllocationRequest{
				AvailableDeviceIDs: r.Available, MustIncludeDeviceIDs: r.Must, AllocationSize: r.Size,
			})
		}
		return answer(p.GetPreferredAllocation(ctx, req))
	default: // devices
		stream, err := p.ListAndWatch(ctx, &api.Empty{})
		if err != nil {
			return answer(nil, err)
		}
		first, err := stream.Recv()
		return answer(first, err)
	}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dpclient DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dpclient: cannot listen on", sock, err)
		os.Exit(1)
	}
	reg := &registry{}
	server := grpc.NewServer()
	api.RegisterRegistrationServer(server, reg)
	go func() { _ = server.Serve(lis) }()
	c := &client{dir: dir, conns: map[string]api.DevicePluginClient{}}
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{"ready": true})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		var cmd command
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			_ = out.Encode(map[string]any{"error": err.Error()})
			continue
		}
		if cmd.Op == "quit" {
			break
		}
		_ = out.Encode(c.handle(cmd, reg))
	}
	server.Stop()
	_ = os.Remove(sock)
}
