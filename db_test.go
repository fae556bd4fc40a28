package oncekit_test

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit"
)

// pgx's own types satisfy the interfaces, checked by the compiler.
var (
	_ oncekit.Pool = (*pgxpool.Pool)(nil)
	_ oncekit.DB   = (*pgxpool.Conn)(nil)
	_ oncekit.DB   = (*pgx.Conn)(nil)
	_ oncekit.DB   = pgx.Tx(nil)
)
