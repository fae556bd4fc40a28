// Package sub is apiguard's test input.
package sub

import "context"

// Limit is exported; limit is not.
const Limit, limit = 10, 1

// Err is a variable of an explicit type.
var Err error

// Config has exported and unexported fields, and an embedded type.
type Config struct {
	Name    string
	Timeout int
	secret  string
	Embedded
}

// Embedded is embedded in Config.
type Embedded struct{ X int }

// Runner is an interface.
type Runner interface {
	Run(ctx context.Context) error
	private()
}

// New takes named parameters; their names are not the API.
func New(cfg *Config, opts ...string) (*Config, error) { return cfg, nil }

// Start is a method.
func (c *Config) Start(ctx context.Context) error { return nil }

func (c *Config) hidden() {}

// Alias is an alias.
type Alias = Config

type internalType struct{}

// Exported on an unexported type is not the API.
func (internalType) Exported() {}
