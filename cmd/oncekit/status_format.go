package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/report"
)

// age formats seconds in its largest whole unit ("45s", "3m", "2h", "4d"),
// rounding down: one screen, read at a glance.
func age(secs float64) string {
	d := time.Duration(secs * float64(time.Second))
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// alarm marks a figure that needs an operator.
func alarm(n int64) string {
	if n > 0 {
		return strconv.FormatInt(n, 10) + " !"
	}
	return "0"
}

func orZeroAge(n int64, secs float64) string {
	if n == 0 {
		return "-"
	}
	return age(secs)
}

// writeStatus prints the report on one screen.
func writeStatus(e *env, r report.Status) error {
	w := e.stdout
	ob := r.Outbox
	fmt.Fprintf(w, "oncekit status, schema %s\n\n", r.Schema)
	fmt.Fprintf(w, "OUTBOX  backlog %d, oldest %s, parked %s\n", ob.Backlog, orZeroAge(ob.Backlog, ob.OldestAgeSeconds), alarm(ob.Parked))
	if ob.Slot != nil {
		fmt.Fprintln(w, "  backlog counts table rows only: in logical mode the events are WAL messages, behind by the slot's lag")
		fmt.Fprintf(w, "  %s\n", slotLine(*ob.Slot))
	}
	var lines []string
	for _, p := range ob.Ranges {
		part := strconv.Itoa(p.First)
		if p.Last != p.First {
			part += "-" + strconv.Itoa(p.Last)
		}
		owner, lease := "-", "free"
		if p.Owner != "" {
			owner, lease = p.Owner, "held, "+age(p.LeaseSeconds)+" left"
			if p.LeaseSeconds <= 0 {
				lease = "expired " + age(-p.LeaseSeconds) + " ago !"
			}
		}
		lines = append(lines, fmt.Sprintf("  %s\t%s\t%s\t%d\t%s", part, owner, lease, p.Backlog, orZeroAge(p.Backlog, p.OldestAgeSeconds)))
	}
	if err := indentTable(w, "  PARTITIONS\tOWNER\tLEASE\tBACKLOG\tOLDEST", lines, "  no partitions leased yet (no relay has run)"); err != nil {
		return err
	}
	nodes := make([]string, 0, len(ob.Nodes))
	for _, n := range ob.Nodes {
		nodes = append(nodes, fmt.Sprintf("%s (heartbeat %s ago)", n.ID, age(n.HeartbeatAgeSeconds)))
	}
	fmt.Fprintf(w, "  relays: %s\n", orNone(nodes))
	keys := make([]string, 0, len(ob.ParkedKeys))
	for _, k := range ob.ParkedKeys {
		keys = append(keys, fmt.Sprintf("%q %d message(s) for %s", k.Key, k.Messages, age(k.ParkedAgeSeconds)))
	}
	fmt.Fprintf(w, "  parked keys: %s\n\n", orNone(keys))

	fmt.Fprintln(w, "INBOX  claims of the last hour; totals from --metrics")
	lines = lines[:0]
	for _, c := range r.Consumers {
		lines = append(lines, fmt.Sprintf("  %s\t%d\t%s\t%s\t%s\t%s", c.Name, c.ClaimsLastHour, counter(c.Processed), counter(c.Duplicates),
			alarm(c.DeadLetters), orZeroAge(c.DeadLetters, c.OldestDeadAgeSeconds)))
	}
	if err := indentTable(w, "  CONSUMER\tCLAIMS 1H\tPROCESSED\tDUPLICATES\tDEAD LETTERS\tOLDEST DEAD", lines, "  no consumer active in the last hour, no dead letters"); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nSIDE EFFECTS  confirmed and failed: recorded in the --recent window")
	lines = lines[:0]
	for _, k := range r.Effects {
		lines = append(lines, fmt.Sprintf("  %s\t%d\t%s\t%d\t%s\t%s\t%d\t%s", k.Kind, k.Pending, alarm(k.Overdue), k.Fired, alarm(k.PastLease),
			alarm(k.Unknown), k.Confirmed, alarm(k.Failed)))
	}
	if err := indentTable(w, "  KIND\tPENDING\tOVERDUE\tFIRED\tPAST LEASE\tUNKNOWN\tCONFIRMED\tFAILED", lines, "  none live or recent"); err != nil {
		return err
	}
	if r.EffectsCapped {
		fmt.Fprintf(w, "  effects counted up to %d due, %d unknown and the newest %d recorded: each figure is at least what it says\n",
			report.LiveCap, report.LiveCap, report.LiveCap)
	}
	id := r.Idempotency
	completed := strconv.FormatInt(id.Completed, 10)
	if id.CompletedCapped {
		completed = "over " + completed
	}
	_, err := fmt.Fprintf(w, "\nIDEMPOTENCY  in progress %d (past lease %s), completed %s, unknown %s\n",
		id.InProgress, alarm(id.InProgressPastLease), completed, alarm(id.Unknown))
	return err
}

func counter(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', -1, 64)
}

func orNone(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ", ")
}

// indentTable is writeTable with a message of its own when empty.
func indentTable(w io.Writer, header string, rows []string, empty string) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, empty)
		return err
	}
	return writeTable(w, header, rows)
}

// slotLine describes the logical relay's slot: in logical mode the events
// live in the WAL, and what is behind is the slot's lag, not the table's
// backlog.
func slotLine(s outbox.SlotStatus) string {
	head := "slot " + s.Name + " (logical mode): "
	switch {
	case s.Lost && !s.Exists:
		return head + "LOST, dropped (oncekit created it and it is gone): the relay stops; see the runbook !"
	case s.Lost:
		return head + "LOST, invalidated (wal_status lost, past max_slot_wal_keep_size): the relay stops; see the runbook !"
	}
	state := "active"
	if !s.Active {
		state = "INACTIVE, no relay streams"
		if s.RetainedBytes > 0 {
			state += " !"
		}
	}
	lag := report.BytesIEC(s.LagBytes)
	if s.LagSeconds != nil {
		lag += ", " + age(*s.LagSeconds)
	} else if s.LagBytes > 0 {
		lag += ", time unknown"
	}
	line := fmt.Sprintf("%s%s; lag %s; WAL retained %s", head, state, lag, report.BytesIEC(s.RetainedBytes))
	if s.WALStatus != "" && s.WALStatus != "reserved" {
		line += "; wal_status " + s.WALStatus + " !"
	}
	if s.SafeWALBytes != nil {
		line += "; invalidated after " + report.BytesIEC(*s.SafeWALBytes) + " more"
	}
	if s.Standby != nil {
		line += "; standby's copy " + standbyCopy(*s.Standby)
	}
	return line
}

// standbyCopy says whether a failover to the standby keeps the slot.
func standbyCopy(c outbox.StandbySlot) string {
	switch {
	case !c.Exists:
		return "MISSING: a failover loses the slot !"
	case !c.Synced:
		return "NOT SYNCED (PostgreSQL 17, sync_replication_slots): a failover loses the slot !"
	case c.Temporary:
		return "NOT READY, temporary (the standby has not caught up with it) !"
	case c.Invalidation != "":
		return "INVALIDATED (" + c.Invalidation + ") !"
	case !c.Ready:
		return "BEHIND " + report.BytesIEC(c.LagBytes) + " !"
	}
	return "ready, " + report.BytesIEC(c.LagBytes) + " behind"
}
