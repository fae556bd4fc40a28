package migrations_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/migrations"
)

// Apply oncekit's schema at start-up; concurrent deploys are safe and a
// second run applies nothing.
func ExampleUp() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	applied, err := migrations.Up(ctx, pool, migrations.WithSchema("billing_oncekit"))
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range applied {
		log.Printf("applied %03d_%s", m.Version, m.Name)
	}
}

// Teams with their own migration tool take the DDL instead.
func ExampleSQL() {
	ddl, err := migrations.SQL(migrations.WithSchema("billing_oncekit"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(strings.Contains(ddl, `CREATE TABLE "billing_oncekit".outbox`))
	_, err = migrations.SQL(migrations.WithSchema(`x"; DROP SCHEMA public; --`))
	fmt.Println(err != nil)
	// Output:
	// true
	// true
}
