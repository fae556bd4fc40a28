package nodeid

import (
	"fmt"
	"os"
	"regexp"
	"testing"
)

func TestNew(t *testing.T) {
	t.Parallel()
	host, _ := os.Hostname()
	re := regexp.MustCompile("^" + regexp.QuoteMeta(fmt.Sprintf("%s-%d-", host, os.Getpid())) + "[0-9a-f]{8}$")
	a, b := New(), New()
	if !re.MatchString(a) {
		t.Fatalf("New() = %q, want host-pid-8hex", a)
	}
	if a == b {
		t.Fatalf("two calls returned %q", a)
	}
}
