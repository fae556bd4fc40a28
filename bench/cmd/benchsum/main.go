// Command benchsum reads `go test -bench` output (as `make bench` writes it
// to bench.txt) and prints, one machine-readable line each, the median of
// every reported metric and the ratios the targets are stated in, with
// PASS/MISS against each target:
//
//	median BenchmarkRelay/oncekit msgs/s 53800 n=3
//	ratio relay_oncekit/watermill 11.0 target>=15 MISS
//
// With -results FILE it also writes FILE (bench/RESULTS.md under `make
// bench`): the same figures as a Markdown page, with the machine, the date
// and the load the run met, read from the configuration lines ("nproc: 2")
// at the top of the input.
//
// Usage:
//
//	benchsum [-results FILE] [-note TEXT] < bench.txt
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

func main() {
	results := flag.String("results", "", "also write the results page (Markdown) to this file")
	note := flag.String("note", "", "a sentence for the results page's header (how the run was made)")
	flag.Parse()
	run, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchsum:", err)
		os.Exit(1)
	}
	writeSummary(os.Stdout, run)
	if *results != "" {
		if err := writeResultsFile(*results, run, *note); err != nil {
			fmt.Fprintln(os.Stderr, "benchsum:", err)
			os.Exit(1)
		}
	}
}

// writeSummary prints the median and ratio lines.
func writeSummary(w io.Writer, run *run) {
	for _, k := range run.keys() {
		fmt.Fprintf(w, "median %s %s n=%d\n", k, num(run.median(k)), len(run.samples[k]))
	}
	for _, t := range targets {
		v, ok := t.figure(run)
		if !ok {
			continue
		}
		fmt.Fprintf(w, "ratio %s %s target%s%s %s\n", strings.ReplaceAll(t.name, " ", "_"), num(v), t.op, num(t.limit), t.verdict(v))
	}
}

// writeResultsFile writes the results page to path, through a temporary
// file so that a failed run leaves the previous page whole.
func writeResultsFile(path string, run *run, note string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := writeResults(f, run, note); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
