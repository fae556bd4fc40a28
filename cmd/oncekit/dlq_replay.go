package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// The brokers `dlq replay` publishes to: the one the consumer reads.
const (
	brokerNATS     = "nats"
	brokerRabbitMQ = "rabbitmq"
	brokerRedis    = "redis"
)

// connectTimeout bounds the first connection to a replay broker.
const connectTimeout = 5 * time.Second

// noDestinationError is a replay's publish error when the broker has no
// queue or stream by the dead letter's subject: nothing would read the copy
// (RabbitMQ even confirms, and drops, a message routed to no queue), so it
// is not published and the dead letter stays pending.
type noDestinationError struct {
	broker, kind, name string // "RabbitMQ", "queue", the subject
	found              string // what the name is instead, if anything
}

func (e *noDestinationError) Error() string {
	if e.found != "" {
		return fmt.Sprintf("%s has no %s %q (the key is a %s): nothing would read the copy", e.broker, e.kind, e.name, e.found)
	}
	return fmt.Sprintf("%s has no %s %q: nothing would read the copy", e.broker, e.kind, e.name)
}

// replayFlags choose the broker `dlq replay` publishes to, and its URL.
// The URLs' defaults come from the environment after parsing, so help never
// shows one.
type replayFlags struct {
	broker            string
	amqpURL, redisURL envString
	nats              *natsFlags
	e                 *env
}

func (r *replayFlags) register(fs *flag.FlagSet, e *env, nf *natsFlags) {
	r.e, r.nats = e, nf
	fs.StringVar(&r.broker, "broker", brokerNATS, "replay: the `BROKER` the consumer reads, to publish to: nats, rabbitmq or redis")
	fs.Var(&r.amqpURL, "amqp-url", "replay --broker rabbitmq: RabbitMQ `URL`, amqp[s]://user:password@host:port/vhost (default: env AMQP_URL)")
	fs.Var(&r.redisURL, "redis-url", "replay --broker redis: Redis `URL`, redis[s]://[user:password@]host:port[/db] (default: env REDIS_URL)")
}

func (r *replayFlags) amqp() string  { return r.amqpURL.resolve(r.e, "AMQP_URL", "") }
func (r *replayFlags) redis() string { return r.redisURL.resolve(r.e, "REDIS_URL", "") }

// validate checks the broker and that only its URL flag is given, and that
// the URL parses. Its messages never quote a URL.
func (r *replayFlags) validate() error {
	switch r.broker {
	case brokerNATS, brokerRabbitMQ, brokerRedis:
	default:
		return usagef("--broker %q: want nats, rabbitmq or redis", r.broker)
	}
	for _, f := range []struct {
		broker, flag string
		set          bool
	}{
		{brokerNATS, "--nats-url", r.nats.urlFlag.set},
		{brokerRabbitMQ, "--amqp-url", r.amqpURL.set},
		{brokerRedis, "--redis-url", r.redisURL.set},
	} {
		if f.set && f.broker != r.broker {
			return usagef("%s is for --broker %s, and the broker is %s", f.flag, f.broker, r.broker)
		}
	}
	switch r.broker {
	case brokerRabbitMQ:
		if r.amqp() == "" {
			return usagef("--broker rabbitmq needs --amqp-url (or AMQP_URL)")
		}
		if _, err := amqp091.ParseURI(r.amqp()); err != nil {
			return usagef("--amqp-url: not an amqp:// or amqps:// URL")
		}
	case brokerRedis:
		if r.redis() == "" {
			return usagef("--broker redis needs --redis-url (or REDIS_URL)")
		}
		if _, err := redis.ParseURL(r.redis()); err != nil {
			return usagef("--redis-url: not a redis:// or rediss:// URL")
		}
	}
	return nil
}

// open connects to the chosen broker and returns its publisher and a
// closer. On RabbitMQ and Redis, the publisher refuses a message whose
// subject names no queue or stream there (a *noDestinationError).
func (r *replayFlags) open(ctx context.Context) (broker.Publisher, func(), error) {
	switch r.broker {
	case brokerRabbitMQ:
		return r.openRabbitMQ()
	case brokerRedis:
		return r.openRedis(ctx)
	default:
		nc, err := r.nats.connect("oncekit dlq")
		if err != nil {
			return nil, nil, err
		}
		pub, err := natsjs.NewPublisher(nc, nil)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return pub, nc.Close, nil
	}
}

// openRabbitMQ publishes through watermill-amqp's durable queue
// configuration (the default exchange, routing key = queue = subject) with
// publisher confirms, as docs/brokers.md sets the relay up.
func (r *replayFlags) openRabbitMQ() (broker.Publisher, func(), error) {
	where := redact(r.amqp())
	conn, err := amqp.NewConnection(amqp.ConnectionConfig{
		AmqpURI:    r.amqp(),
		AmqpConfig: &amqp091.Config{Heartbeat: 10 * time.Second, Locale: "en_US", Dial: amqp091.DefaultDial(connectTimeout)},
	}, watermill.NopLogger{})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to RabbitMQ at %s: %w", where, err)
	}
	cfg := amqp.NewDurableQueueConfig(r.amqp())
	cfg.Publish.ConfirmDelivery = true
	wp, err := amqp.NewPublisherWithConnection(cfg, watermill.NopLogger{}, conn)
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("RabbitMQ at %s: %w", where, err)
	}
	exists := func(_ context.Context, queue string) error {
		ch, err := conn.Connection().Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
			var ae *amqp091.Error
			if errors.As(err, &ae) && ae.Code == amqp091.NotFound {
				return &noDestinationError{broker: "RabbitMQ", kind: "queue", name: queue}
			}
			return err
		}
		return nil
	}
	return newCheckedPublisher(wp, exists, func() { _ = wp.Close(); _ = conn.Close() })
}

// openRedis publishes to Redis Streams through watermill-redisstream.
func (r *replayFlags) openRedis(ctx context.Context) (broker.Publisher, func(), error) {
	opts, err := redis.ParseURL(r.redis()) // validated
	if err != nil {
		return nil, nil, usagef("--redis-url: not a redis:// or rediss:// URL")
	}
	opts.DialTimeout = connectTimeout
	where := redact(r.redis())
	client := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		_ = client.Close()
		return nil, nil, fmt.Errorf("connect to Redis at %s: %w", where, err)
	}
	wp, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, watermill.NopLogger{})
	if err != nil {
		_ = client.Close()
		return nil, nil, fmt.Errorf("Redis at %s: %w", where, err)
	}
	exists := func(ctx context.Context, stream string) error {
		typ, err := client.Type(ctx, stream).Result()
		switch {
		case err != nil:
			return err
		case typ == "none":
			return &noDestinationError{broker: "Redis", kind: "stream", name: stream}
		case typ != "stream":
			return &noDestinationError{broker: "Redis", kind: "stream", name: stream, found: typ}
		}
		return nil
	}
	return newCheckedPublisher(wp, exists, func() { _ = wp.Close(); _ = client.Close() })
}

// newCheckedPublisher wraps a watermill publisher as a broker.Publisher that
// first checks each message's destination exists. closeFn closes what the
// watermill publisher runs on.
func newCheckedPublisher(wp message.Publisher, exists func(context.Context, string) error, closeFn func()) (broker.Publisher, func(), error) {
	pub, err := asbroker.NewPublisher(wp, nil)
	if err != nil {
		closeFn()
		return nil, nil, err
	}
	return &checkedPublisher{pub: pub, exists: exists}, func() { _ = pub.Close(); closeFn() }, nil
}

// checkedPublisher publishes only the messages whose subject exists as a
// queue or stream on the broker; the others fail with a
// *noDestinationError. It reports the connection of the publisher it
// wraps, as that one does.
type checkedPublisher struct {
	pub    *asbroker.Publisher
	exists func(ctx context.Context, dest string) error
}

var _ broker.ConnectedPublisher = (*checkedPublisher)(nil)

// Connected reports the wrapped publisher's connection.
func (p *checkedPublisher) Connected() bool { return p.pub.Connected() }

// Publish checks each message's destination, then publishes the ones that
// exist; the results keep msgs' order.
func (p *checkedPublisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := make([]broker.Result, len(msgs))
	var send []broker.Message
	var at []int
	for i, m := range msgs {
		res[i].ID = m.ID
		if err := p.exists(ctx, m.Subject); err != nil {
			res[i].Err = err
			continue
		}
		send = append(send, m)
		at = append(at, i)
	}
	if len(send) > 0 {
		for j, r := range p.pub.Publish(ctx, send) {
			res[at[j]] = r
		}
	}
	return res
}

// brokerName is the broker's name in the command's output.
func brokerName(b string) string {
	switch b {
	case brokerRabbitMQ:
		return "RabbitMQ"
	case brokerRedis:
		return "Redis"
	default:
		return "NATS"
	}
}
