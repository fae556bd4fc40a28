package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/oncekit/oncekit/outbox/fleet"
)

// writeFleetStatus prints a line per database.
func writeFleetStatus(w io.Writer, dbs []fleet.DatabaseStatus) error {
	lines := make([]string, 0, len(dbs))
	for _, d := range dbs {
		if !d.Up {
			lines = append(lines, strings.Join([]string{cell(d.Name), "DOWN", "-", "-", "-", "-", "-", cell(d.Down)}, "\t"))
			continue
		}
		oldest := "-"
		if d.Backlog > 0 || d.Logical {
			oldest = d.Oldest().String()
		}
		lines = append(lines, fmt.Sprintf("%s\tup\t%d\t%s\t%d\t%d/%d\t%d", cell(d.Name), d.Backlog, oldest, d.Parked,
			d.Owned, d.Partitions, d.Relays))
	}
	return writeTable(w, "DATABASE\tSTATE\tBACKLOG\tOLDEST\tPARKED\tOWNED\tRELAYS", lines)
}
