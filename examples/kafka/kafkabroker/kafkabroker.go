// Package kafkabroker wires watermill-kafka (IBM/sarama) into oncekit's
// broker seam through watermill/asbroker, with the settings oncekit needs
// from Kafka: messages partitioned by their ordering key (the Oncekit-Key
// header), the idempotent producer, a consumer group reading from the
// oldest offset, a missing topic reported instead of created, and a
// connection probe so that the relay tells an outage from a refused
// message.
//
// Kafka does not dedup by oncekit's event ID: the idempotent producer drops
// the retries of one producer session only, so a message the relay publishes
// again (it died between publish and mark) is stored twice, and the inbox's
// claim on the event ID dedups it.
package kafkabroker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// ErrInvalidConfig is returned for a configuration that cannot work.
var ErrInvalidConfig = errors.New("kafkabroker: invalid config")

// ErrTopicMissing is returned by NewSource for a topic the cluster does not
// have: a consumer group on it would wait for it silently.
var ErrTopicMissing = errors.New("kafkabroker: topic missing")

// ErrUnreachable wraps the error of a constructor that reached no broker.
var ErrUnreachable = errors.New("kafkabroker: no Kafka broker reachable")

// Config configures the publisher and the source. Only Brokers is required
// (and Group, for a source).
type Config struct {
	// Brokers are the bootstrap addresses, host:port.
	Brokers []string
	// Group is the consumer group of a source: every source of one group
	// shares the topic's partitions.
	Group string
	// SessionTimeout is how long the group waits for a member that stopped
	// heartbeating (a killed process) before handing its partitions to the
	// others. Defaults to 10 s; the broker bounds it by its
	// group.min.session.timeout.ms.
	SessionTimeout time.Duration
	// AckWait is the source's redelivery timer (asbroker.SourceConfig).
	// Defaults to 30 s.
	AckWait time.Duration
	// MaxMessageBytes is the largest message the producer sends; a larger
	// one fails at once, before reaching the broker. Defaults to sarama's
	// 1 MB; keep it at most the broker's message.max.bytes.
	MaxMessageBytes int
	// AutoCreateTopics lets a publish or a source create a topic it names
	// (with the broker's default partitions), where the broker's
	// auto.create.topics.enable allows it. Off by default: a misspelt topic
	// is then an error (parked messages, ErrTopicMissing) rather than a
	// topic nobody reads.
	AutoCreateTopics bool
	// Logger receives watermill-kafka's logs. Defaults to none.
	Logger watermill.LoggerAdapter
}

func (c Config) check() (Config, error) {
	if len(c.Brokers) == 0 {
		return c, fmt.Errorf("%w: Brokers is required", ErrInvalidConfig)
	}
	if c.SessionTimeout < 0 || c.AckWait < 0 || c.MaxMessageBytes < 0 {
		return c, fmt.Errorf("%w: SessionTimeout, AckWait and MaxMessageBytes may not be negative", ErrInvalidConfig)
	}
	c.SessionTimeout = cmp.Or(c.SessionTimeout, 10*time.Second)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c, nil
}

// Marshaler carries oncekit's headers as Kafka record headers and sets the
// record key to the message's ordering key, so that sarama's hash
// partitioner puts a key's messages in one partition, in order.
func Marshaler() kafka.MarshalerUnmarshaler {
	return kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get(broker.HeaderKey), nil
	})
}

// saramaConfig is the base configuration of both sides: a missing topic is
// an error unless AutoCreateTopics, and metadata retries are short, so that
// a broker down at start fails the constructor within seconds.
func saramaConfig(c Config) *sarama.Config {
	s := sarama.NewConfig()
	s.ClientID = "oncekit"
	s.Version = sarama.V2_1_0_0
	s.Metadata.AllowAutoTopicCreation = c.AutoCreateTopics
	s.Metadata.Retry.Max = 3
	s.Metadata.Retry.Backoff = 250 * time.Millisecond
	s.Net.DialTimeout = 5 * time.Second
	return s
}

// PublisherSarama is the producer's sarama configuration: synchronous
// (Publish returns once every in-sync replica stored the message) and
// idempotent (a retry of the session is not stored twice).
func PublisherSarama(c Config) *sarama.Config {
	s := saramaConfig(c)
	s.Producer.Return.Successes = true
	s.Producer.RequiredAcks = sarama.WaitForAll
	s.Producer.Idempotent = true
	s.Net.MaxOpenRequests = 1
	s.Producer.Retry.Max = 3
	s.Producer.Retry.Backoff = 100 * time.Millisecond
	if c.MaxMessageBytes > 0 {
		s.Producer.MaxMessageBytes = c.MaxMessageBytes
	}
	return s
}

// SubscriberSarama is the consumer group's sarama configuration: a new
// group starts at the oldest offset (nothing the relay published before the
// first consumer started is skipped), and offsets are committed each
// second after the ack.
func SubscriberSarama(c Config) *sarama.Config {
	s := saramaConfig(c)
	s.Consumer.Return.Errors = true
	s.Consumer.Offsets.Initial = sarama.OffsetOldest
	s.Consumer.Offsets.AutoCommit.Interval = time.Second
	s.Consumer.Group.Session.Timeout = c.SessionTimeout
	s.Consumer.Group.Heartbeat.Interval = c.SessionTimeout / 4
	s.Consumer.Group.Rebalance.Timeout = 2 * c.SessionTimeout
	return s
}

// Publisher is oncekit's broker.Publisher on Kafka. Close it once done.
type Publisher struct {
	*asbroker.Publisher
	wpub   *kafka.Publisher
	client sarama.Client
}

// NewPublisher connects a producer to cfg.Brokers. It fails with
// ErrUnreachable when no broker answers.
func NewPublisher(cfg Config) (*Publisher, error) {
	c, err := cfg.check()
	if err != nil {
		return nil, err
	}
	sc := PublisherSarama(c)
	wpub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers, Marshaler: Marshaler(), OverwriteSaramaConfig: sc}, c.Logger)
	if err != nil {
		return nil, fmt.Errorf("%w (%v): %w", ErrUnreachable, c.Brokers, err)
	}
	// A client of its own for the connection probe: the relay asks it
	// after failures only.
	client, err := sarama.NewClient(c.Brokers, saramaConfig(c))
	if err != nil {
		_ = wpub.Close()
		return nil, fmt.Errorf("%w (%v): %w", ErrUnreachable, c.Brokers, err)
	}
	pub, err := asbroker.NewPublisher(wpub, &asbroker.PublisherConfig{
		Connected: func() bool { return client.RefreshMetadata() == nil },
	})
	if err != nil {
		_ = wpub.Close()
		_ = client.Close()
		return nil, err
	}
	return &Publisher{Publisher: pub, wpub: wpub, client: client}, nil
}

// Close waits for the publishes in flight, then closes the producer.
func (p *Publisher) Close() error {
	return errors.Join(p.Publisher.Close(), p.wpub.Close(), p.client.Close())
}

// Source is oncekit's broker.Source on a Kafka consumer group. Close it
// once done.
type Source struct {
	*asbroker.Source
	wsub *kafka.Subscriber
}

// NewSource joins cfg.Group and reads topics. It fails with ErrUnreachable
// when no broker answers. ctx bounds the subscribing only.
func NewSource(ctx context.Context, cfg Config, topics ...string) (*Source, error) {
	c, err := cfg.check()
	if err != nil {
		return nil, err
	}
	if c.Group == "" {
		return nil, fmt.Errorf("%w: Group is required for a source", ErrInvalidConfig)
	}
	if err := topicsExist(c, topics); err != nil {
		return nil, err
	}
	wsub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: c.Brokers, Unmarshaler: Marshaler(), ConsumerGroup: c.Group,
		OverwriteSaramaConfig: SubscriberSarama(c), NackResendSleep: kafka.NoSleep, ReconnectRetrySleep: time.Second,
	}, c.Logger)
	if err != nil {
		return nil, err
	}
	src, err := asbroker.NewSource(ctx, wsub, &asbroker.SourceConfig{Topics: topics, AckWait: c.AckWait})
	if err != nil {
		_ = wsub.Close()
		return nil, err
	}
	return &Source{Source: src, wsub: wsub}, nil
}

// Close nacks the deliveries in hand, then leaves the group, so that the
// other members get its partitions at once. Safe to call twice.
func (s *Source) Close() {
	s.Source.Close()
	_ = s.wsub.Close()
}

// topicsExist checks that the cluster has every topic: it fails with
// ErrUnreachable when no broker answers, ErrTopicMissing for a topic it
// does not have.
func topicsExist(c Config, topics []string) error {
	client, err := sarama.NewClient(c.Brokers, saramaConfig(c))
	if err != nil {
		return fmt.Errorf("%w (%v): %w", ErrUnreachable, c.Brokers, err)
	}
	defer client.Close()
	for _, t := range topics {
		if _, err := client.Partitions(t); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrTopicMissing, t, err)
		}
	}
	return nil
}
