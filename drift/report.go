package drift

import (
	"encoding/json"
	"fmt"
	"github.com/oncekit/oncekit/internal/untrusted"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// WriteTable prints the report as an aligned table, one check a line
// (status ok, DRIFT, or ERROR when the check could not run), with the
// examples of failing checks and the errors below it.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tVALUE\tLIMIT\tSTATUS")
	for _, f := range r.Findings {
		status, value := "ok", num(f.Value)
		switch {
		case f.Failed():
			status, value = "ERROR", "-"
		case f.Drift:
			status = "DRIFT"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Check, value, num(f.Limit), status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Findings {
		if f.Failed() {
			if _, err := fmt.Fprintf(w, "  %s: could not run: %s\n", f.Check, f.Error); err != nil {
				return err
			}
		}
		for _, ex := range f.Examples {
			// An example is the database's data: escaped for the terminal.
			if _, err := fmt.Fprintf(w, "  %s: %s\n", f.Check, untrusted.Printable(ex)); err != nil {
				return err
			}
		}
	}
	return nil
}

func num(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// findingJSON is a Finding in WriteJSON's output.
type findingJSON struct {
	Check        string   `json:"check"`
	Status       string   `json:"status"`
	Value        float64  `json:"value"`
	Limit        float64  `json:"limit"`
	Drift        bool     `json:"drift"`
	Error        string   `json:"error,omitempty"`
	Examples     []string `json:"examples"`
	IDs          []string `json:"ids,omitempty"`
	Missing      []string `json:"missing,omitempty"`
	MissingTotal int64    `json:"missing_total,omitempty"`
	Extra        []string `json:"extra,omitempty"`
	ExtraTotal   int64    `json:"extra_total,omitempty"`
	Seconds      float64  `json:"seconds"`
}

// WriteJSON prints the report as one JSON object: at, drifted, failed and
// the findings (snake_case fields; lists are never null).
func (r Report) WriteJSON(w io.Writer) error {
	out := struct {
		At       time.Time     `json:"at"`
		Drifted  bool          `json:"drifted"`
		Failed   bool          `json:"failed"`
		Findings []findingJSON `json:"findings"`
	}{At: r.At.UTC(), Drifted: r.Drifted(), Failed: r.Failed(), Findings: make([]findingJSON, 0, len(r.Findings))}
	for _, f := range r.Findings {
		status := "ok"
		switch {
		case f.Failed():
			status = "error"
		case f.Drift:
			status = "drift"
		}
		ex := f.Examples
		if ex == nil {
			ex = []string{}
		}
		out.Findings = append(out.Findings, findingJSON{Check: f.Check, Status: status, Value: f.Value, Limit: f.Limit,
			Drift: f.Drift, Error: f.Error, Examples: ex, IDs: f.IDs, Missing: f.Missing, MissingTotal: f.MissingTotal,
			Extra: f.Extra, ExtraTotal: f.ExtraTotal, Seconds: f.Duration.Seconds()})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
