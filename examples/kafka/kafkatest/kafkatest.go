// Package kafkatest starts an in-process Kafka cluster (franz-go's kfake)
// for tests and for the example's default run: three brokers on loopback
// ports, consumer groups, the idempotent producer. It proves the client's
// and the adapter's behaviour, not Kafka's replication.
package kafkatest

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Brokers is the size of the cluster Start starts.
const Brokers = 3

// MinSessionTimeout is the cluster's group.min.session.timeout.ms: short,
// so that a test's killed consumer is evicted within seconds.
const MinSessionTimeout = 500 * time.Millisecond

// Start starts a cluster of three brokers on 127.0.0.1; opts are added to
// kfake's (kfake.BrokerConfigs for message.max.bytes, for instance). Close
// it once done.
func Start(opts ...kfake.Opt) (*kfake.Cluster, error) {
	base := []kfake.Opt{kfake.NumBrokers(Brokers), kfake.GroupMinSessionTimeout(MinSessionTimeout)}
	c, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafkatest: start kfake: %w", err)
	}
	return c, nil
}

// New starts a cluster for the test, closed when it ends, and returns its
// bootstrap addresses.
func New(t testing.TB, opts ...kfake.Opt) (*kfake.Cluster, []string) {
	t.Helper()
	c, err := Start(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

var unsafe = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Topic creates a topic named after the test with the given partitions,
// replicated on every broker.
func Topic(t testing.TB, brokers []string, partitions int32) string {
	t.Helper()
	name := strings.Trim(unsafe.ReplaceAllString(t.Name(), "_"), "_")
	if len(name) > 200 {
		name = name[len(name)-200:]
	}
	if err := CreateTopic(brokers, name, partitions); err != nil {
		t.Fatal(err)
	}
	return name
}

// CreateTopic creates a topic, replicated on every broker.
func CreateTopic(brokers []string, name string, partitions int32) error {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		return fmt.Errorf("kafkatest: admin: %w", err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: Brokers}, false); err != nil {
		return fmt.Errorf("kafkatest: create topic %s: %w", name, err)
	}
	return nil
}

// Stored counts the records of a topic: the sum of its partitions' next
// offsets (kfake compacts and expires nothing unless told to).
func Stored(brokers []string, topic string) (int, error) {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_1_0_0
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return 0, fmt.Errorf("kafkatest: client: %w", err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return 0, fmt.Errorf("kafkatest: partitions of %s: %w", topic, err)
	}
	n := 0
	for _, p := range parts {
		off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, fmt.Errorf("kafkatest: offset of %s/%d: %w", topic, p, err)
		}
		n += int(off)
	}
	return n, nil
}
