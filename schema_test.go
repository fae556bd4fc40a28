package oncekit_test

import (
	"errors"
	"testing"

	"github.com/oncekit/oncekit"
)

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{"": oncekit.DefaultSchema, "oncekit": "oncekit", "_app_2": "_app_2"} {
		got, err := oncekit.ValidateSchema(name)
		if err != nil || got != want {
			t.Errorf("ValidateSchema(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"Oncekit", "a-b", `x"; DROP TABLE t; --`, "1abc", string(make([]byte, 64))} {
		if _, err := oncekit.ValidateSchema(name); !errors.Is(err, oncekit.ErrInvalidSchema) {
			t.Errorf("ValidateSchema(%q): %v; want ErrInvalidSchema", name, err)
		}
	}
}
