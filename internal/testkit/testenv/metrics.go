package testenv

import (
	"bytes"
	"net"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric returns the value of the first sample of the metric family name
// whose labels include every name/value pair in labels: a counter's or
// gauge's value, a histogram's sample count; 0 when there is none. It is safe
// to call from any goroutine (require.Eventually conditions included): a
// failure to gather is reported with t.Errorf.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Errorf("testenv: gather metrics: %v", err)
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	sample:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
						break
					}
				}
				if !found {
					continue sample
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

// SyncBuffer is a bytes.Buffer safe for concurrent use: the stdout and
// stderr of a subprocess under test, read while it runs.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreeAddr returns a loopback address with a port free at the time of the
// call, for a process under test to listen on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	return addr
}
