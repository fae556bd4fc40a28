package main

import (
	"bytes"
	"strings"
	"testing"
)

// The broker benchmarks' lines, as the example modules print them, give
// the page a row each with oncekit's rate, the peer's and the paired ratio,
// and the summary a ratio line each.
func TestBrokerRows(t *testing.T) {
	r, err := parse(strings.NewReader(`nproc: 2
pkg: github.com/oncekit/oncekit/examples/kafka
BenchmarkKafkaRelay-2 1 542485024 ns/op 5551 msgs/s 9232 watermill-msgs/s 0.6013 x-watermill
BenchmarkKafkaRelay-2 1 542485024 ns/op 5000 msgs/s 10000 watermill-msgs/s 0.5 x-watermill
BenchmarkKafkaRelay-2 1 542485024 ns/op 6000 msgs/s 8000 watermill-msgs/s 0.75 x-watermill
pkg: github.com/oncekit/oncekit/examples/sqs
BenchmarkSQSConsume-2 1 1279542459 ns/op 2345 msgs/s 748.8 sdk-msgs/s 3.131 x-sdk
`))
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	if err := writeResults(&page, r, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Other brokers",
		"| Kafka: relay drain (kafkabroker) | 5,551 (5,000–6,000) | watermill-kafka's publisher | 9,232 (8,000–10,000) | 0.601 (0.5–0.75) |",
		"| SQS: batch inbox consumer | 2,345 | the AWS SDK's ReceiveMessage, an INSERT a message, DeleteMessageBatch | 749 | 3.13 |",
	} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("page lacks %q:\n%s", want, page.String())
		}
	}
	if strings.Contains(page.String(), "Kafka: batch inbox consumer") {
		t.Error("page has a row for a benchmark the run lacks")
	}
	var sum bytes.Buffer
	writeSummary(&sum, r)
	for _, want := range []string{"ratio kafka-relay_oncekit/watermill 0.6013 paired\n", "ratio sqs-consume_oncekit/sdk 3.131 paired\n"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}
}
