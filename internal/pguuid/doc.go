// Package pguuid encodes github.com/google/uuid's UUID as PostgreSQL's
// uuid directly (Register), instead of through its text form.
package pguuid
