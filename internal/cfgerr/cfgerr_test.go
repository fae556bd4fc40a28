package cfgerr

import (
	"errors"
	"testing"
)

func TestNew(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("pkg: invalid config")
	cause := errors.New("bad name")
	err := New(sentinel, "pkg: Config.Schema", "%w", cause)
	if got, want := err.Error(), "pkg: Config.Schema: bad name"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, sentinel) || !errors.Is(err, cause) {
		t.Fatalf("%v wraps neither the sentinel nor the cause", err)
	}
	if err := New(sentinel, "pkg: Config.N", "%d is negative", -1); err.Error() != "pkg: Config.N: -1 is negative" || !errors.Is(err, sentinel) {
		t.Fatalf("got %v", err)
	}
	if err := New(sentinel, "pkg: Config.Secret", "%w", errors.New("pkg: bad secret")); err.Error() != "pkg: Config.Secret: bad secret" {
		t.Fatalf("got %v", err)
	}
}

func TestFor(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("pkg: invalid config")
	bad := For(sentinel, "pkg: RelayConfig")
	err := bad("MaxAttempts", "%d must be positive", 0)
	if got, want := err.Error(), "pkg: RelayConfig.MaxAttempts: 0 must be positive"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("%v does not wrap the sentinel", err)
	}
}

func TestCopyOf(t *testing.T) {
	t.Parallel()
	type config struct{ N int }
	if got := CopyOf[config](nil); got != (config{}) {
		t.Fatalf("CopyOf(nil) = %+v, want the zero config", got)
	}
	c := &config{N: 3}
	got := CopyOf(c)
	got.N = 4
	if c.N != 3 {
		t.Fatalf("CopyOf returned c itself")
	}
}
