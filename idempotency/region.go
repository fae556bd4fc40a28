package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
)

// Headers of the edge's multi-region homing (Route.Homing).
const (
	// HeaderHomeRegion names the home region of the request's scope on a
	// 421 IDEMPOTENCY_WRONG_REGION answer, for the client or its gateway
	// to send the request (and its retries, under the same key) there.
	HeaderHomeRegion = "Idempotency-Home-Region"
	// HeaderForwardedFrom is set by an edge that forwards a request to
	// its scope's home region, to the forwarding edge's region. A request
	// that carries it is served in its home region and refused (421)
	// anywhere else, never forwarded twice.
	HeaderForwardedFrom = "Idempotency-Forwarded-From"
)

// MaxRegionLen is the longest region name, in bytes.
const MaxRegionLen = 63

// Homing gives each scope (Route.Tenant's answer) a home region, where
// its keys are claimed and its requests run. In an active-active
// deployment where each region's edge has its own store, a retry that
// lands in another region than its first attempt would run again there:
// with Homing, a request outside its scope's home is forwarded to the
// home region's edge (Peers) or refused with 421 IDEMPOTENCY_WRONG_REGION,
// before its key is claimed, so the request runs in one region only.
type Homing struct {
	// Region is this edge's region: 1 to MaxRegionLen bytes of lower-case
	// letters, digits and "-_.". Required.
	Region string
	// Home returns the home region of a scope. It must answer the same in
	// every region (a fixed placement, a directory that changes only with
	// a scope's migration). An error answers 503 (or the status of an
	// error with a StatusCode() int method) IDEMPOTENCY_HOME_REGION_UNKNOWN,
	// as does a name that is not a region's. Required.
	Home func(ctx context.Context, scope string) (string, error)
	// Peers holds the base URL of other regions' edges. A request whose
	// home is a peer is forwarded there with its path, query, headers
	// (authentication included: the home edge authenticates it again) and
	// body, and HeaderForwardedFrom set. Defaults to nil: a request outside
	// its home is refused (421) with HeaderHomeRegion, since forwarding
	// needs the address of each region's edge and a link between regions
	// trusted to carry the caller's credentials, which only the deployment
	// can provide.
	Peers map[string]*url.URL
	// Transport carries forwarded requests. Defaults to
	// http.DefaultTransport.
	Transport http.RoundTripper
}

// ValidRegion reports whether name is a region name: 1 to MaxRegionLen
// bytes of lower-case letters, digits and "-_.".
func ValidRegion(name string) bool {
	if name == "" || len(name) > MaxRegionLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("-_.", c) >= 0) {
			return false
		}
	}
	return true
}

// validate checks a Homing, naming the bad field.
func (h *Homing) validate() error {
	switch {
	case !ValidRegion(h.Region):
		return fmt.Errorf("Region %q: 1 to %d bytes of lower-case letters, digits and \"-_.\"", h.Region, MaxRegionLen)
	case h.Home == nil:
		return errors.New("Home: required")
	}
	for name, u := range h.Peers {
		switch {
		case !ValidRegion(name):
			return fmt.Errorf("Peers: region %q: 1 to %d bytes of lower-case letters, digits and \"-_.\"", name, MaxRegionLen)
		case name == h.Region:
			return fmt.Errorf("Peers: %q is this edge's own region", name)
		case u == nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			return fmt.Errorf("Peers: region %q: an absolute http or https URL", name)
		}
	}
	return nil
}

// homing routes a request by its scope's home region; it reports true when
// the request is this region's to serve, and otherwise has answered it
// (forwarded, refused, or failed).
func (rt *route) homing(w http.ResponseWriter, r *http.Request, scope string) bool {
	h := rt.cfg.Homing
	if h == nil {
		return true
	}
	from, forwarded := r.Header[HeaderForwardedFrom]
	if forwarded && (len(from) != 1 || !ValidRegion(from[0])) {
		rt.count(OutcomeRejected)
		writeProblem(w, http.StatusBadRequest, CodeRegionInvalid,
			fmt.Sprintf("%s must be one region name: 1 to %d bytes of lower-case letters, digits and \"-_.\"", HeaderForwardedFrom, MaxRegionLen), 0)
		return false
	}
	home, err := h.Home(r.Context(), scope)
	if err == nil && !ValidRegion(home) {
		err = fmt.Errorf("Homing.Home answered %d bytes that are not a region name", len(home))
	}
	if err != nil {
		rt.count(OutcomeError)
		rt.e.log.Error("idempotency: the scope's home region is unknown", "operation", rt.cfg.Operation, "error", err)
		status := http.StatusServiceUnavailable
		var sc statusCoder
		if errors.As(err, &sc) && sc.StatusCode() >= 400 {
			status = sc.StatusCode()
		}
		writeProblem(w, status, CodeHomeUnknown, "", rt.retryAfterSeconds())
		return false
	}
	if home == h.Region {
		return true
	}
	peer, ok := h.Peers[home]
	if !ok || forwarded {
		rt.count(OutcomeMisdirected)
		w.Header().Set(HeaderHomeRegion, home)
		writeProblem(w, http.StatusMisdirectedRequest, CodeWrongRegion,
			"this caller's requests are served in region "+home+"; send this request and its retries there, under the same Idempotency-Key", 0)
		return false
	}
	rt.count(OutcomeForwarded)
	rt.forward(w, r, home, peer)
	return false
}

// forward sends r to the home region's edge at peer and relays its answer.
func (rt *route) forward(w http.ResponseWriter, r *http.Request, home string, peer *url.URL) {
	h := rt.cfg.Homing
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(peer)
			pr.Out.Host = peer.Host
			pr.Out.Header.Set(HeaderForwardedFrom, h.Region)
		},
		Transport: h.Transport,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			rt.e.log.Warn("idempotency: forwarding to the home region failed", "operation", rt.cfg.Operation, "home", home, "error", err)
			writeProblem(w, http.StatusBadGateway, CodeHomeUnreachable,
				"the request could not be forwarded to region "+home+", or its answer was lost; retry with the same Idempotency-Key", rt.retryAfterSeconds())
		},
	}
	proxy.ServeHTTP(w, r)
}
