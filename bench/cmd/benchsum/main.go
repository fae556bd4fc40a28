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
// With -scale it reads `make bench-scale` output instead (bench-scale.txt):
// it adds the scale verdicts to the summary and, with -results, replaces
// only the page's scale section (or appends one), leaving the rest as it
// was; without -scale the page is written anew and keeps its scale section.
//
// Usage:
//
//	benchsum [-scale] [-results FILE] [-note TEXT] < bench.txt
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"strings"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("benchsum: ")
	results := flag.String("results", "", "also write the results page (Markdown) to this file")
	note := flag.String("note", "", "a sentence for the results page's header (how the run was made)")
	scale := flag.Bool("scale", false, "the input is `make bench-scale` output: write only the page's scale section")
	flag.Parse()
	run, err := parse(os.Stdin)
	if err != nil {
		log.Fatal(err)
	}
	writeSummary(os.Stdout, run)
	if *results == "" {
		return
	}
	write := keepScale(*results)
	if *scale {
		write = replaceScale(*results)
	}
	if err := writeResultsFile(*results, run, *note, write); err != nil {
		log.Fatal(err)
	}
}

// writeSummary prints the median and ratio lines.
func writeSummary(w io.Writer, run *run) {
	for _, k := range run.keys() {
		fmt.Fprintf(w, "median %s %s n=%d\n", k, num(run.median(k)), len(run.samples[k]))
	}
	for _, line := range scaleVerdicts(run) {
		fmt.Fprintln(w, "ratio", line)
	}
	for _, line := range brokerRatios(run) {
		fmt.Fprintln(w, "ratio", line)
	}
	for _, t := range targets {
		v, ok := t.figure(run)
		if !ok {
			continue
		}
		fmt.Fprintf(w, "ratio %s %s target%s%s %s\n", strings.ReplaceAll(t.name, " ", "_"), num(v), t.op, num(t.limit), t.judge(run, v))
	}
}

// pageWriter writes a results page from a run.
type pageWriter func(w io.Writer, r *run, note string) error

// keepScale is writeResults followed by the scale section of the page at
// path, if it has one.
func keepScale(path string) pageWriter {
	section := scaleSectionOf(path)
	return func(w io.Writer, r *run, note string) error {
		if err := writeResults(w, r, note); err != nil {
			return err
		}
		if section == "" {
			return nil
		}
		_, err := io.WriteString(w, "\n"+section)
		return err
	}
}

// replaceScale writes the page at path with its scale section replaced by
// the run's (appended when it has none).
func replaceScale(path string) pageWriter {
	page, _ := os.ReadFile(path) // none yet: the section alone
	return func(w io.Writer, r *run, note string) error {
		var section strings.Builder
		if err := writeScale(&section, r, note); err != nil {
			return err
		}
		_, err := io.WriteString(w, withScaleSection(string(page), section.String()))
		return err
	}
}

// writeResultsFile writes the results page to path with write, through a
// temporary file so that a failed run leaves the previous page whole.
func writeResultsFile(path string, run *run, note string, write pageWriter) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := write(f, run, note); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
