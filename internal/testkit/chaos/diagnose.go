package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// diagnose logs what a run that did not drain leaves behind for the reader
// of a CI log: the durable's state as the broker has it, and the last
// warnings and errors of each consumer and relay process.
func diagnose(ctx context.Context, urls []string, dir string, logf func(string, ...any)) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if ci, err := consumerInfo(ctx, urls, "PAYMENTS", "ledger"); err != nil {
		logf("diagnose: consumer info: %v", err)
	} else {
		logf("diagnose: durable ledger: delivered=%d ack_floor=%d num_pending=%d ack_pending=%d redelivered=%d waiting=%d leader=%s",
			ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, leaderOf(ci))
	}
	for _, role := range []string{"consume-1", "consume-2", "relay-1", "relay-2"} {
		lines, err := lastLines(filepath.Join(dir, role+".log"), 12, func(l string) bool {
			return strings.Contains(l, " WARN ") || strings.Contains(l, " ERROR ") || strings.HasPrefix(l, "--- chaos")
		})
		if err != nil {
			logf("diagnose: %s: %v", role, err)
			continue
		}
		for _, l := range lines {
			logf("diagnose: %s: %s", role, l)
		}
	}
}

func consumerInfo(ctx context.Context, urls []string, stream, durable string) (*jetstream.ConsumerInfo, error) {
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

func leaderOf(ci *jetstream.ConsumerInfo) string {
	if ci.Cluster == nil {
		return ""
	}
	return ci.Cluster.Leader
}

// lastLines returns the last n lines of the file that keep accepts.
func lastLines(path string, n int, keep func(string) bool) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); keep(l) {
			out = append(out, l)
			if len(out) > n {
				out = out[1:]
			}
		}
	}
	return out, sc.Err()
}

// headLines returns s cut to its first n lines, saying how many it left out.
func headLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) <= n {
		return s
	}
	return strings.Join(lines[:n], "\n") + fmt.Sprintf("\n… %d more lines", len(lines)-n)
}
