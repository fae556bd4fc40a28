package sqsbroker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/oncekit/oncekit/broker"
)

// Message attributes the adapter sets.
const (
	// AttrHeaders carries every header of the message as a JSON object.
	AttrHeaders = "Oncekit-Headers"
	// AttrEventID repeats the event ID, for people reading the queue.
	AttrEventID = "Oncekit-Event-Id"
	// AttrBodyEncoding is "base64" when the body is the base64 of the
	// payload, "empty" when the payload is empty (SQS refuses an empty body).
	AttrBodyEncoding = "Oncekit-Body-Encoding"
)

// maxBatch is SQS's limit of messages in one SendMessageBatch call.
const maxBatch = 10

// DefaultMaxMessageSize is PublisherConfig.MaxMessageSize's default: 256
// KiB, SQS's MaximumMessageSize for most queues.
const DefaultMaxMessageSize = 256 << 10

// API is the part of *sqs.Client the adapter uses.
type API interface {
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessage(ctx context.Context, in *sqs.DeleteMessageInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, opts ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, opts ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

// ErrInvalidConfig is returned for a configuration the constructors cannot
// use; the message names the field.
var ErrInvalidConfig = errors.New("sqsbroker: invalid config")

// ErrQueueMissing is the error of a call to a queue that does not exist:
// Source.Limits returns it (so inbox.Consumer.Run refuses to start), and
// so does each message Publish sends to one (the relay counts an attempt
// and parks the message after MaxAttempts, SQS being reachable).
var ErrQueueMissing = errors.New("sqsbroker: queue does not exist")

// ErrTooLarge is the error of a message larger than
// PublisherConfig.MaxMessageSize, as SQS counts it (body and attributes):
// it is refused before the call, on its own; the relay counts an attempt
// and parks it after MaxAttempts.
var ErrTooLarge = errors.New("sqsbroker: message larger than the queue's maximum size")

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// QueueURL maps a message's subject to the URL of the queue it is sent
	// to. Required.
	QueueURL func(subject string) string
	// FIFO sets MessageDeduplicationId (the event ID) and MessageGroupId
	// (the key, or the subject for a message without one): the queues are
	// FIFO queues.
	FIFO bool
	// MaxMessageSize is the queues' MaximumMessageSize in bytes: a message
	// larger than it (body and attributes, the way SQS counts) fails with
	// ErrTooLarge, and a SendMessageBatch call carries at most this many
	// bytes in all (SQS refuses a larger batch whole). Defaults to
	// DefaultMaxMessageSize.
	MaxMessageSize int
}

// Publisher is a broker.Publisher over SQS. It sends up to 10 messages per
// SendMessageBatch call, and reports each message's own result from the
// batch's Successful and Failed entries. A nil Err means SQS stored the
// message. Result.Duplicate is never set: SQS does not say when a FIFO
// queue dropped a copy.
//
// It is a broker.ConnectedPublisher: a call that got no answer from SQS
// (refused connection, timeout) makes Connected report false until one
// gets an answer, so that an outage parks nothing.
type Publisher struct {
	api          API
	cfg          PublisherConfig
	disconnected atomic.Bool
}

var _ broker.ConnectedPublisher = (*Publisher)(nil)

// NewPublisher returns a Publisher sending through api.
func NewPublisher(api API, cfg PublisherConfig) (*Publisher, error) {
	if api == nil {
		return nil, fmt.Errorf("%w: api is required", ErrInvalidConfig)
	}
	if cfg.QueueURL == nil {
		return nil, fmt.Errorf("%w: PublisherConfig.QueueURL is required", ErrInvalidConfig)
	}
	if cfg.MaxMessageSize < 0 {
		return nil, fmt.Errorf("%w: PublisherConfig.MaxMessageSize is negative", ErrInvalidConfig)
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = DefaultMaxMessageSize
	}
	return &Publisher{api: api, cfg: cfg}, nil
}

// Connected reports whether the last call to SQS got an answer (an error
// from SQS is an answer).
func (p *Publisher) Connected() bool { return !p.disconnected.Load() }

// Publish sends msgs, batched by queue, and returns one result per message
// in msgs' order.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := make([]broker.Result, len(msgs))
	byQueue := map[string][]int{}
	var queues []string
	for i, m := range msgs {
		res[i].ID = m.ID
		q := p.cfg.QueueURL(m.Subject)
		if _, ok := byQueue[q]; !ok {
			queues = append(queues, q)
		}
		byQueue[q] = append(byQueue[q], i)
	}
	for _, q := range queues {
		var batch []types.SendMessageBatchRequestEntry
		size := 0
		for _, i := range byQueue[q] {
			e, err := p.entry(strconv.Itoa(i), msgs[i])
			if err != nil {
				res[i].Err = err
				continue
			}
			n := entrySize(e)
			if n > p.cfg.MaxMessageSize {
				res[i].Err = fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, n, p.cfg.MaxMessageSize)
				continue
			}
			if len(batch) == maxBatch || size+n > p.cfg.MaxMessageSize {
				p.sendBatch(ctx, q, batch, res)
				batch, size = nil, 0
			}
			batch, size = append(batch, e), size+n
		}
		if len(batch) > 0 {
			p.sendBatch(ctx, q, batch, res)
		}
	}
	return res
}

// entrySize is the size SQS counts for e: its body, and each attribute's
// name, data type and value.
func entrySize(e types.SendMessageBatchRequestEntry) int {
	n := len(aws.ToString(e.MessageBody))
	for k, a := range e.MessageAttributes {
		n += len(k) + len(aws.ToString(a.DataType)) + len(aws.ToString(a.StringValue)) + len(a.BinaryValue)
	}
	return n
}

// sendBatch sends entries (whose IDs are indexes into res) to queue in one
// call and fills their results.
func (p *Publisher) sendBatch(ctx context.Context, queue string, entries []types.SendMessageBatchRequestEntry, res []broker.Result) {
	out, err := p.api.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queue), Entries: entries})
	var apiErr smithy.APIError
	p.disconnected.Store(err != nil && !errors.As(err, &apiErr))
	err = classify(err, queue)
	pending := map[int]bool{}
	for _, e := range entries {
		i, _ := strconv.Atoi(aws.ToString(e.Id))
		pending[i] = true
	}
	if err == nil {
		for _, s := range out.Successful {
			i, _ := strconv.Atoi(aws.ToString(s.Id))
			delete(pending, i)
		}
		for _, f := range out.Failed {
			i, _ := strconv.Atoi(aws.ToString(f.Id))
			res[i].Err = fmt.Errorf("sqsbroker: %s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
			delete(pending, i)
		}
		err = errors.New("sqsbroker: message missing from SQS's batch answer")
	}
	for i := range pending {
		res[i].Err = err // unknown outcome: the relay publishes again with the same ID
	}
}

// entry is m as an SQS batch entry with id.
func (p *Publisher) entry(id string, m broker.Message) (types.SendMessageBatchRequestEntry, error) {
	headers := map[string]string{broker.HeaderEventID: m.ID.String()}
	if m.Key != "" {
		headers[broker.HeaderKey] = m.Key
	}
	for k, v := range m.Headers {
		headers[k] = v
	}
	hj, err := json.Marshal(headers)
	if err != nil {
		return types.SendMessageBatchRequestEntry{}, fmt.Errorf("sqsbroker: headers: %w", err)
	}
	attrs := map[string]types.MessageAttributeValue{
		AttrHeaders: stringAttr(string(hj)),
		AttrEventID: stringAttr(m.ID.String()),
	}
	body := string(m.Payload)
	switch {
	case len(m.Payload) == 0: // SQS refuses an empty body
		body = "-"
		attrs[AttrBodyEncoding] = stringAttr("empty")
	case !validBody(body):
		body = base64.StdEncoding.EncodeToString(m.Payload)
		attrs[AttrBodyEncoding] = stringAttr("base64")
	}
	e := types.SendMessageBatchRequestEntry{Id: aws.String(id), MessageBody: aws.String(body), MessageAttributes: attrs}
	if p.cfg.FIFO {
		group := m.Key
		if group == "" {
			group = m.Subject
		}
		e.MessageDeduplicationId = aws.String(m.ID.String())
		e.MessageGroupId = aws.String(group)
	}
	return e, nil
}

// classify wraps ErrQueueMissing around SQS's answer that queue does not
// exist; other errors are returned as they are.
func classify(err error, queue string) error {
	var missing *types.QueueDoesNotExist
	var apiErr smithy.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &missing),
		errors.As(err, &apiErr) && (apiErr.ErrorCode() == "AWS.SimpleQueueService.NonExistentQueue" || apiErr.ErrorCode() == "QueueDoesNotExist"):
		return fmt.Errorf("%w: %s: %w", ErrQueueMissing, queue, err)
	default:
		return err
	}
}

func stringAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// validBody reports whether SQS accepts s as a message body: UTF-8 of the characters #x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD
// and #x10000 to #x10FFFF.
func validBody(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		switch {
		case r == 0x9, r == 0xA, r == 0xD:
		case r >= 0x20 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r >= 0x10000 && r <= 0x10FFFF:
		default:
			return false
		}
	}
	return true
}
