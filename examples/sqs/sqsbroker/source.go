package sqsbroker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/oncekit/oncekit/broker"
)

// maxVisibility is SQS's longest visibility timeout.
const maxVisibility = 12 * time.Hour

// SourceConfig configures a Source.
type SourceConfig struct {
	// QueueURL is the queue read. Required.
	QueueURL string
	// Subject is what the deliveries report as their subject (a dead
	// letter keeps it, and a replay maps it back to a queue through
	// PublisherConfig.QueueURL). Required.
	Subject string
	// AckWait is the visibility timeout asked for each received message,
	// and how far InProgress extends it. Defaults to 30 s.
	AckWait time.Duration
	// WaitTime is the long poll of one ReceiveMessage call, at most 20 s.
	// Defaults to 20 s.
	WaitTime time.Duration
	// FIFO reports the queue as a FIFO queue: Limits then reports SQS's
	// 5-minute deduplication window.
	FIFO bool
}

// Source is a broker.Source reading one SQS queue.
type Source struct {
	api  API
	cfg  SourceConfig
	once sync.Once
	done chan struct{}
}

var _ broker.Source = (*Source)(nil)

// NewSource returns a Source reading cfg.QueueURL through api.
func NewSource(api API, cfg SourceConfig) (*Source, error) {
	switch {
	case api == nil:
		return nil, fmt.Errorf("%w: api is required", ErrInvalidConfig)
	case cfg.QueueURL == "":
		return nil, fmt.Errorf("%w: SourceConfig.QueueURL is required", ErrInvalidConfig)
	case cfg.Subject == "":
		return nil, fmt.Errorf("%w: SourceConfig.Subject is required", ErrInvalidConfig)
	case cfg.AckWait < 0 || cfg.AckWait > maxVisibility:
		return nil, fmt.Errorf("%w: SourceConfig.AckWait: %s is outside 0 to 12h", ErrInvalidConfig, cfg.AckWait)
	case cfg.WaitTime < 0 || cfg.WaitTime > 20*time.Second:
		return nil, fmt.Errorf("%w: SourceConfig.WaitTime: %s is outside 0 to 20s", ErrInvalidConfig, cfg.WaitTime)
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.WaitTime == 0 {
		cfg.WaitTime = 20 * time.Second
	}
	return &Source{api: api, cfg: cfg, done: make(chan struct{})}, nil
}

// Close stops the source: Receive then returns broker.ErrSourceClosed.
// Messages in hand become visible again after their visibility timeout.
func (s *Source) Close() { s.once.Do(func() { close(s.done) }) }

// Limits reads the queue's attributes: it returns ErrQueueMissing for a
// queue that does not exist, and ErrInvalidConfig when the queue is FIFO
// and the config says otherwise (or the reverse). It reports the
// visibility timeout asked for as the ack wait, SQS's 5-minute
// deduplication window on a FIFO queue, and a redrive policy's
// maxReceiveCount as MaxDeliver: SQS moves a message to the policy's
// dead-letter queue at that receive, so the inbox's MaxAttempts must stay
// below it for the inbox to dead-letter first.
func (s *Source) Limits(ctx context.Context) (broker.SourceLimits, error) {
	out, err := s.api.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(s.cfg.QueueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameFifoQueue, types.QueueAttributeNameRedrivePolicy},
	})
	if err != nil {
		return broker.SourceLimits{}, fmt.Errorf("sqsbroker: queue attributes: %w", classify(err, s.cfg.QueueURL))
	}
	if fifo := out.Attributes[string(types.QueueAttributeNameFifoQueue)] == "true"; fifo != s.cfg.FIFO {
		return broker.SourceLimits{}, fmt.Errorf("%w: SourceConfig.FIFO is %v, the queue's FifoQueue %v", ErrInvalidConfig, s.cfg.FIFO, fifo)
	}
	l := broker.SourceLimits{AckWait: s.cfg.AckWait}
	if s.cfg.FIFO {
		l.Duplicates = 5 * time.Minute
	}
	if p := out.Attributes[string(types.QueueAttributeNameRedrivePolicy)]; p != "" {
		var rp struct {
			MaxReceiveCount json.Number `json:"maxReceiveCount"`
		}
		if err := json.Unmarshal([]byte(p), &rp); err != nil {
			return broker.SourceLimits{}, fmt.Errorf("sqsbroker: the queue's RedrivePolicy: %w", err)
		}
		n, err := rp.MaxReceiveCount.Int64()
		if err != nil {
			return broker.SourceLimits{}, fmt.Errorf("sqsbroker: the queue's RedrivePolicy maxReceiveCount: %w", err)
		}
		l.MaxDeliver = int(n)
	}
	return l, nil
}

// Receive long-polls the queue until at least one message arrives, ctx
// ends or the source is closed.
func (s *Source) Receive(ctx context.Context, n int) ([]broker.Delivery, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		out, err := s.api.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(s.cfg.QueueURL),
			MaxNumberOfMessages:         int32(min(max(n, 1), maxBatch)),
			WaitTimeSeconds:             int32(s.cfg.WaitTime / time.Second),
			VisibilityTimeout:           int32(s.cfg.AckWait / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
		})
		select {
		case <-s.done:
			return nil, broker.ErrSourceClosed
		default:
		}
		if err != nil {
			return nil, classify(err, s.cfg.QueueURL)
		}
		if len(out.Messages) == 0 {
			continue
		}
		ds := make([]broker.Delivery, 0, len(out.Messages))
		for _, m := range out.Messages {
			ds = append(ds, s.delivery(m))
		}
		return ds, nil
	}
}

// delivery decodes m. A message whose headers do not decode keeps only the
// ones it has; the consumer dead-letters one without a valid event ID.
func (s *Source) delivery(m types.Message) *delivery {
	d := &delivery{src: s, handle: aws.ToString(m.ReceiptHandle), headers: map[string][]string{}, attempt: 1, data: []byte(aws.ToString(m.Body))}
	if a, ok := m.MessageAttributes[AttrHeaders]; ok {
		var hs map[string]string
		if json.Unmarshal([]byte(aws.ToString(a.StringValue)), &hs) == nil {
			for k, v := range hs {
				d.headers[k] = []string{v}
			}
		}
	}
	switch a := m.MessageAttributes[AttrBodyEncoding]; aws.ToString(a.StringValue) {
	case "empty":
		d.data = nil
	case "base64":
		if b, err := base64.StdEncoding.DecodeString(aws.ToString(m.Body)); err == nil {
			d.data = b
		}
	}
	if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
		d.attempt = n
	}
	return d
}

// delivery is one received SQS message.
type delivery struct {
	src     *Source
	handle  string
	data    []byte
	headers map[string][]string
	attempt int
}

func (d *delivery) Subject() string              { return d.src.cfg.Subject }
func (d *delivery) Data() []byte                 { return d.data }
func (d *delivery) Headers() map[string][]string { return d.headers }
func (d *delivery) Attempt() int                 { return d.attempt }

func (d *delivery) Header(name string) string {
	if vs := d.headers[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// Ack deletes the message from the queue.
func (d *delivery) Ack(ctx context.Context) error {
	_, err := d.src.api.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(d.src.cfg.QueueURL), ReceiptHandle: aws.String(d.handle)})
	return err
}

// Nak makes the message visible again after delay (at most 12 hours).
func (d *delivery) Nak(ctx context.Context, delay time.Duration) error {
	return d.visible(ctx, min(delay, maxVisibility))
}

// InProgress hides the message for another AckWait.
func (d *delivery) InProgress(ctx context.Context) error { return d.visible(ctx, d.src.cfg.AckWait) }

func (d *delivery) visible(ctx context.Context, after time.Duration) error {
	_, err := d.src.api.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(d.src.cfg.QueueURL), ReceiptHandle: aws.String(d.handle),
		VisibilityTimeout: int32((after + time.Second - 1) / time.Second), // never sooner than after
	})
	return err
}
