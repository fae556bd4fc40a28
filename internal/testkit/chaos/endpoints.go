package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/oncekit/oncekit/internal/wait"
)

// waitHTTP waits, for a minute at the most, until GET url answers 200: a
// process of the example is serving.
func waitHTTP(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := wait.Until(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("not ready: %w", err)
	}
	return nil
}

// apiToken and apiCaller are the payments example's demo credential and
// the caller it authenticates: the scope of every key the load sends.
const apiToken, apiCaller = "demo-token", "demo-client"

// apiOperation is the payments example's edge operation.
const apiOperation = "create-payment"

// post sends one payment request to the API under key and returns the HTTP
// status, the body read to the end so that the connection is reused.
func post(ctx context.Context, client *http.Client, url, key string, body []byte, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, fmt.Errorf("body of HTTP %d: %w", resp.StatusCode, err)
	}
	return resp.StatusCode, nil
}

// providerCalls reads the record of every call the fake provider at base
// received.
func providerCalls(ctx context.Context, base string) ([]ProviderCall, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/calls", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("provider calls: %w", err)
	}
	defer resp.Body.Close()
	var calls []ProviderCall
	if err := json.NewDecoder(resp.Body).Decode(&calls); err != nil {
		return nil, fmt.Errorf("provider calls: %w", err)
	}
	return calls, nil
}
