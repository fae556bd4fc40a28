package drift

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
)

// WriteTable prints the report as an aligned table, one check a line, with
// the examples of failing rules below it.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tVALUE\tLIMIT\tSTATUS")
	for _, f := range r.Findings {
		status := "ok"
		if f.Drift {
			status = "DRIFT"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Check, num(f.Value), num(f.Limit), status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Findings {
		for _, ex := range f.Examples {
			if _, err := fmt.Fprintf(w, "  %s: %s\n", f.Check, ex); err != nil {
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
