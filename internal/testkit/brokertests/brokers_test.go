package brokertests_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/watermill/asbroker"
)

// The constructors the tests and their helper processes share: a broker
// kind ("rabbitmq" or "redis"), its address, and a destination (a queue or
// a stream).

// redisClaim is how long a message a consumer received and never acked
// stays with it before another consumer of the group claims it.
const redisClaim = 2 * time.Second

// amqpConfig is watermill-amqp's durable queue configuration with
// publisher confirms: Publish returns once RabbitMQ stored the message.
func amqpConfig(uri string) amqp.Config {
	cfg := amqp.NewDurableQueueConfig(uri)
	cfg.Publish.ConfirmDelivery = true
	return cfg
}

// onChannel runs fn on a channel of a new connection to uri.
func onChannel(uri string, fn func(*amqp091.Channel) error) error {
	conn, err := amqp091.Dial(uri)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return fn(ch)
}

// declareQueue declares a durable queue as watermill-amqp's durable queue
// configuration does, with args.
func declareQueue(uri, queue string, args amqp091.Table) error {
	return onChannel(uri, func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, args)
		return err
	})
}

// queueLen is the number of ready messages in queue.
func queueLen(uri, queue string) (n int, err error) {
	err = onChannel(uri, func(ch *amqp091.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n, err
}

// newPublisher returns an oncekit publisher on the broker, and its closer.
func newPublisher(kind, addr string) (*asbroker.Publisher, func(), error) {
	var wp message.Publisher
	var err error
	switch kind {
	case "rabbitmq":
		wp, err = amqp.NewPublisher(amqpConfig(addr), watermill.NopLogger{})
	case "redis":
		wp, err = redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(&redis.Options{Addr: addr})}, watermill.NopLogger{})
	default:
		err = fmt.Errorf("unknown broker %q", kind)
	}
	if err != nil {
		return nil, nil, err
	}
	pub, err := asbroker.NewPublisher(wp, nil)
	if err != nil {
		return nil, nil, err
	}
	return pub, func() { _ = pub.Close(); _ = wp.Close() }, nil
}

// newSource subscribes a new consumer (its own connection) to dest: a
// queue's consumer on RabbitMQ, a member of the stream's consumer group "g"
// on Redis.
func newSource(kind, addr, dest string, cfg *asbroker.SourceConfig) (*asbroker.Source, func(), error) {
	c := asbroker.SourceConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Topics = []string{dest}
	var sub message.Subscriber
	var err error
	switch kind {
	case "rabbitmq":
		sub, err = amqp.NewSubscriber(amqpConfig(addr), watermill.NopLogger{})
	case "redis":
		if c.AckWait == 0 {
			c.AckWait = 2 * redisClaim
		}
		sub, err = redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client: redis.NewClient(&redis.Options{Addr: addr}), ConsumerGroup: "g", Consumer: watermill.NewShortUUID(),
			ClaimInterval: redisClaim / 4, MaxIdleTime: redisClaim, BlockTime: 50 * time.Millisecond,
			DisableIndefiniteInitialBlock: true,
		}, watermill.NopLogger{})
	default:
		err = fmt.Errorf("unknown broker %q", kind)
	}
	if err != nil {
		return nil, nil, err
	}
	src, err := asbroker.NewSource(context.Background(), sub, &c)
	if err != nil {
		_ = sub.Close()
		return nil, nil, err
	}
	return src, func() { src.Close(); _ = sub.Close() }, nil
}
