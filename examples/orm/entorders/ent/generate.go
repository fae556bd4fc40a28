// Package ent is the ent client generated from ./schema (go generate).
package ent

//go:generate go run -mod=mod entgo.io/ent/cmd/ent generate ./schema
