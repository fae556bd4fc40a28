package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// discardLogger drops everything.
var discardLogger = slog.New(slog.DiscardHandler)

// newRegistry returns a registry with the Go and process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// The ops listener's limits: a request is read within opsReadTimeout, its
// answer written within opsWriteTimeout (a scrape of a large registry
// included), and a keep-alive connection left idle is closed after
// opsIdleTimeout, so that idle or slow clients cannot hold connections.
const (
	opsReadTimeout  = 10 * time.Second
	opsWriteTimeout = 30 * time.Second
	opsIdleTimeout  = 60 * time.Second
)

// opsServer is the ops listener's server for h.
func opsServer(h http.Handler, idle time.Duration) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: opsReadTimeout,
		WriteTimeout: opsWriteTimeout, IdleTimeout: idle}
}

// serveOps serves /healthz (healthy reports nil when the daemon is fine) and
// /metrics on addr until ctx ends. An empty addr disables it. It returns once
// the listener is bound, so a bad address is reported at start.
func serveOps(ctx context.Context, log *slog.Logger, addr string, reg *prometheus.Registry, healthy func(context.Context) error) error {
	if addr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		hctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := healthy(hctx); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return usagef("--listen %s: %v", addr, err)
	}
	srv := opsServer(mux, opsIdleTimeout)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("ops server stopped", "err", err)
		}
	}()
	log.Info("serving /healthz and /metrics", "addr", ln.Addr().String())
	return nil
}
