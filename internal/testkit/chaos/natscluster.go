package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oncekit/oncekit/internal/wait"
)

// NATSServerEnv names an environment variable that, when set, is the path of
// the nats-server binary StartNATSCluster runs. Otherwise it builds the
// nats-server of the version go.mod requires (the one the in-process tests
// run), not whatever older server the machine has installed: an R3 stream
// on nats-server 2.9.10 (Debian 12's package) was seen to lose its dedup
// state and its durable's acks across node kills (docs/proof.md).
const NATSServerEnv = "ONCEKIT_NATS_SERVER"

// natsServerPkg is the nats-server main package, built at go.mod's version.
const natsServerPkg = "github.com/nats-io/nats-server/v2"

// natsStartTimeout bounds StartNATSCluster and Restart when ctx has no
// earlier deadline.
const natsStartTimeout = 90 * time.Second

// NATSCluster is a JetStream cluster of nats-server processes on loopback,
// each with its own client, cluster and monitoring port, config file, store
// and log file under the directory given to StartNATSCluster.
//
// Clients should connect with every URL and reconnect for ever, quickly:
//
//	nats.Connect(strings.Join(c.URLs(), ","),
//		nats.MaxReconnects(-1),               // a node kill must not end the connection
//		nats.ReconnectWait(100*time.Millisecond),
//		nats.ReconnectJitter(50*time.Millisecond, 0),
//		nats.RetryOnFailedConnect(true),      // a process started while a node is down
//		nats.Timeout(2*time.Second))
//
// With server URLs listed, nats.go picks another node at once when its node
// dies (the reconnect buffer holds what is published meanwhile); the cluster
// also gossips its URLs, so one URL would do, but all of them survive a
// restart of the first.
//
// What to expect while a node is SIGKILLed: the stream and consumer groups
// (Raft) whose leader was on that node elect a new leader only after the
// followers' election timeout; with nats-server 2.9 on loopback that took
// about 4 to 6 s. Until then JetStream API calls for that stream get no
// answer from a leader: js.Publish fails fast with
// jetstream.ErrNoStreamResponse ("nats: no response from stream", the
// survivors have no responder for the stream's subject), or with
// context.DeadlineExceeded / nats.ErrTimeout (jetstream's default is 5 s) if
// the request was in flight to the dying leader. A timed-out publish has an
// unknown outcome: retry it, after a short pause, with the same Nats-Msg-Id;
// the stream's duplicate window absorbs a copy that was stored after all.
// Pull requests (Fetch, Consume) return no messages or a timeout for the
// same period, and acks sent to a consumer leader that died may be lost, so
// those messages are redelivered after AckWait. Give each JetStream call a
// few seconds and retry; never treat a timeout as a definite failure. Groups
// whose leader survived are not interrupted; the meta group (stream and
// consumer create, info) behaves alike when its leader was on the killed
// node. A restarted node catches up from its store and the leader in one to
// a few seconds.
type NATSCluster struct {
	dir   string
	bin   string
	nodes []*natsNode

	mu sync.Mutex // guards each node's proc
}

// natsNode is one server of the cluster; proc is nil while it is down.
type natsNode struct {
	name        string
	conf        string
	log         string
	clientPort  int
	clusterPort int
	httpPort    int
	proc        *process
}

// StartNATSCluster starts n nats-server processes forming one JetStream
// cluster and waits until every node is healthy: a meta leader is elected
// and every node is current with it. Configs, stores and logs live under dir
// (node i in dir/n<i>). On error nothing is left running.
func StartNATSCluster(ctx context.Context, dir string, n int) (*NATSCluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("chaos: a NATS cluster needs at least one node, got %d", n)
	}
	bin, err := natsServerPath(ctx, dir)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	c := &NATSCluster{dir: dir, bin: bin}
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+1])
	}
	for i := range n {
		node := &natsNode{
			name:        fmt.Sprintf("n%d", i),
			clientPort:  ports[3*i],
			clusterPort: ports[3*i+1],
			httpPort:    ports[3*i+2],
		}
		nodeDir := filepath.Join(dir, node.name)
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return nil, err
		}
		node.conf = filepath.Join(nodeDir, "nats.conf")
		node.log = filepath.Join(nodeDir, "nats.log")
		if err := os.WriteFile(node.conf, []byte(node.config(filepath.Join(nodeDir, "store"), routes)), 0o644); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, node)
	}
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			c.Close()
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, natsStartTimeout)
	defer cancel()
	if err := poll(ctx, c.Healthy); err != nil {
		c.Close()
		return nil, fmt.Errorf("chaos: NATS cluster did not become healthy: %w", err)
	}
	return c, nil
}

// config renders the node's nats-server configuration.
func (n *natsNode) config(storeDir string, routes []string) string {
	quoted := make([]string, len(routes))
	for i, r := range routes {
		quoted[i] = fmt.Sprintf("%q", r)
	}
	return fmt.Sprintf(`server_name: %q
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
jetstream {
  store_dir: %q
  max_memory_store: 64MB
  max_file_store: 1GB
}
cluster {
  name: "oncekit-chaos"
  listen: "127.0.0.1:%d"
  routes: [%s]
}
`, n.name, n.clientPort, n.httpPort, storeDir, n.clusterPort, strings.Join(quoted, ", "))
}

// natsServerPath returns the nats-server binary to run: NATSServerEnv's,
// or one built into dir at the version go.mod requires.
func natsServerPath(ctx context.Context, dir string) (string, error) {
	if p := os.Getenv(NATSServerEnv); p != "" {
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nats-server")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, natsServerPkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("chaos: go build %s: %w: %s", natsServerPkg, err, out)
	}
	return bin, nil
}

// NATSServerVersion returns what the cluster's nats-server says of its
// version.
func (c *NATSCluster) NATSServerVersion() string {
	out, err := exec.Command(c.bin, "--version").Output()
	if err != nil {
		return "unknown: " + err.Error()
	}
	return strings.TrimSpace(string(out))
}

// URLs returns the client URL of every node, in node order.
func (c *NATSCluster) URLs() []string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", n.clientPort)
	}
	return urls
}

// ServerName returns the server_name of node i (n0, n1, …), as JetStream
// reports it in stream and consumer cluster info.
func (c *NATSCluster) ServerName(i int) string { return c.nodes[i].name }

// Node returns the index of the node whose server_name is name, or -1.
func (c *NATSCluster) Node(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// start runs node i's process.
func (c *NATSCluster) start(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	node := c.nodes[i]
	if node.proc != nil && !node.proc.exited() {
		return fmt.Errorf("chaos: NATS node %d is running", i)
	}
	p, err := startProcess(c.bin, []string{"-c", node.conf}, nil, node.log)
	if err != nil {
		return err
	}
	node.proc = p
	return nil
}

// Kill sends SIGKILL to node i and waits until the process is gone. Killing a
// node that is down is a no-op.
func (c *NATSCluster) Kill(i int) error {
	c.mu.Lock()
	p := c.nodes[i].proc
	c.nodes[i].proc = nil
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.kill()
}

// Pause stops node i (SIGSTOP) without closing its connections: a hung
// host, which takes what is sent to it and answers nothing, until Resume
// or Kill. Pausing a node that is down is a no-op.
func (c *NATSCluster) Pause(i int) error { return c.signal(i, syscall.SIGSTOP) }

// Resume lets node i, paused, run again (SIGCONT). Resuming a node that is
// down is a no-op.
func (c *NATSCluster) Resume(i int) error { return c.signal(i, syscall.SIGCONT) }

func (c *NATSCluster) signal(i int, sig syscall.Signal) error {
	c.mu.Lock()
	p := c.nodes[i].proc
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.signal(sig)
}

// Restart starts node i again after Kill, on the same ports and store, and
// waits until it is healthy: in contact with the meta leader, current with
// it, and its streams and consumers caught up.
func (c *NATSCluster) Restart(ctx context.Context, i int) error {
	if err := c.start(i); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, natsStartTimeout)
	defer cancel()
	if err := poll(ctx, func(ctx context.Context) error { return c.healthz(ctx, i) }); err != nil {
		return fmt.Errorf("chaos: NATS node %d did not catch up: %w", i, err)
	}
	return nil
}

// Healthy reports nil when every node is up and its /healthz monitoring
// endpoint answers ok (JetStream has a meta leader, the node is current with
// it, and its streams and consumers are current); else the first problem.
func (c *NATSCluster) Healthy(ctx context.Context) error {
	for i := range c.nodes {
		if err := c.healthz(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// healthz asks node i's monitoring endpoint.
func (c *NATSCluster) healthz(ctx context.Context, i int) error {
	c.mu.Lock()
	p := c.nodes[i].proc
	c.mu.Unlock()
	if p == nil || p.exited() {
		return fmt.Errorf("NATS node %d is down", i)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", c.nodes[i].httpPort)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("NATS node %d: %w", i, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var h struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	_ = json.Unmarshal(body, &h)
	if resp.StatusCode != http.StatusOK || h.Status != "ok" {
		return fmt.Errorf("NATS node %d: healthz %d %s %s", i, resp.StatusCode, h.Status, h.Error)
	}
	return nil
}

// Close kills every node. The files under dir stay for the caller to read
// or remove.
func (c *NATSCluster) Close() {
	for i := range c.nodes {
		_ = c.Kill(i)
	}
}

// poll calls check every 50 ms until it returns nil or ctx ends; then it
// returns the last error of check.
func poll(ctx context.Context, check func(context.Context) error) error {
	return wait.Until(ctx, 50*time.Millisecond, check)
}
