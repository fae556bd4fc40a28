package main

import (
	"fmt"
	"strings"
)

// brokerRow is one benchmark of another broker than JetStream (run in the
// example module of that broker): oncekit's rate, and its peer's rate and
// oncekit's ratio to it, both measured in the same iteration.
type brokerRow struct {
	bench, name string // name: on the summary's ratio line
	what        string
	peer        string // the peer, as the page names it
	peerRate    string // the peer's rate metric
	ratio       string // oncekit's rate over the peer's, paired
}

var brokerRows = []brokerRow{
	{"BenchmarkKafkaRelay", "kafka-relay", "Kafka: relay drain (kafkabroker)", "watermill-kafka's publisher", "watermill-msgs/s", "x-watermill"},
	{"BenchmarkKafkaConsume", "kafka-consume", "Kafka: batch inbox consumer", "watermill-kafka's subscriber, an INSERT a message", "watermill-msgs/s", "x-watermill"},
	{"BenchmarkSQSRelay", "sqs-relay", "SQS: relay drain (sqsbroker)", "the AWS SDK's SendMessageBatch", "sdk-msgs/s", "x-sdk"},
	{"BenchmarkSQSConsume", "sqs-consume", "SQS: batch inbox consumer", "the AWS SDK's ReceiveMessage, an INSERT a message, DeleteMessageBatch", "sdk-msgs/s", "x-sdk"},
}

// brokerRatios returns the summary's lines of the broker benchmarks the
// run has: "kafka-relay_oncekit/watermill 0.6 paired".
func brokerRatios(r *run) []string {
	var out []string
	for _, row := range brokerRows {
		k := row.bench + " " + row.ratio
		if len(r.samples[k]) == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s_oncekit/%s %s paired", row.name, strings.TrimPrefix(row.ratio, "x-"), num(r.median(k))))
	}
	return out
}

// writeBrokers writes the table of the broker benchmarks the run has;
// nothing when it has none.
func writeBrokers(w *strings.Builder, r *run) {
	var rows []brokerRow
	for _, row := range brokerRows {
		if len(r.samples[row.bench+" "+row.ratio]) > 0 {
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		return
	}
	w.WriteString("\n## Other brokers\n\n")
	w.WriteString("Each iteration runs the peer, then oncekit, on the same broker (a three-broker kfake cluster in the\n")
	w.WriteString("process; fauxqs on 127.0.0.1): the ratio is oncekit's rate over the peer's in that iteration, its\n")
	w.WriteString("median over the iterations, with the range.\n\n")
	w.WriteString("| path | oncekit msgs/s | peer | peer msgs/s | ×peer (paired) |\n|---|---|---|---|---|\n")
	cell := func(k string) string {
		if len(r.samples[k]) == 0 {
			return ""
		}
		s := human(r.median(k))
		if len(r.samples[k]) > 1 {
			lo, hi := r.spread(k)
			s += " (" + human(lo) + "–" + human(hi) + ")"
		}
		return s
	}
	for _, row := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", row.what, cell(row.bench+" msgs/s"), row.peer, cell(row.bench+" "+row.peerRate), cell(row.bench+" "+row.ratio))
	}
}
