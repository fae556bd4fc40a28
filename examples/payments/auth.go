package main

import (
	"context"
	"net/http"
	"strings"
)

// demoCaller and demoToken are the API's one caller and its credential, as
// the demo and the chaos load use them. A service takes its callers from
// its identity provider; PAYMENTS_API_TOKENS ("token=caller,...") replaces
// them here.
const demoCaller, demoToken = "demo-client", "demo-token"

type callerKey struct{}

// authenticate stands for the service's own authentication: it admits a
// request whose bearer token is one of tokens and puts the caller it names
// in the request's context. The edge sits behind it: a replay or a 409 only
// ever answers an authenticated caller, in the caller's own scope.
func authenticate(tokens map[string]string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		caller := tokens[token]
		if !ok || caller == "" {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller)))
	})
}

// callerOf is the edge's Tenant: keys are scoped by the caller authenticate
// admitted.
func callerOf(r *http.Request) (string, error) {
	caller, _ := r.Context().Value(callerKey{}).(string)
	return caller, nil // "" (no caller) answers 403
}

// parseTokens reads "token=caller,..." (PAYMENTS_API_TOKENS); empty means
// the demo's one caller.
func parseTokens(s string) map[string]string {
	tokens := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		if token, caller, ok := strings.Cut(strings.TrimSpace(pair), "="); ok && token != "" && caller != "" {
			tokens[token] = caller
		}
	}
	if len(tokens) == 0 {
		tokens[demoToken] = demoCaller
	}
	return tokens
}
