package sqsbroker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

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

// API is the part of *sqs.Client the adapter uses.
type API interface {
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessage(ctx context.Context, in *sqs.DeleteMessageInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, opts ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

// ErrInvalidConfig is returned for a configuration the constructors cannot
// use; the message names the field.
var ErrInvalidConfig = errors.New("sqsbroker: invalid config")

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// QueueURL maps a message's subject to the URL of the queue it is sent
	// to. Required.
	QueueURL func(subject string) string
	// FIFO sets MessageDeduplicationId (the event ID) and MessageGroupId
	// (the key, or the subject for a message without one): the queues are
	// FIFO queues.
	FIFO bool
}

// Publisher is a broker.Publisher over SQS. It sends up to 10 messages per
// SendMessageBatch call, and reports each message's own result from the
// batch's Successful and Failed entries. A nil Err means SQS stored the
// message. Result.Duplicate is never set: SQS does not say when a FIFO
// queue dropped a copy.
type Publisher struct {
	api API
	cfg PublisherConfig
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher sending through api.
func NewPublisher(api API, cfg PublisherConfig) (*Publisher, error) {
	if api == nil {
		return nil, fmt.Errorf("%w: api is required", ErrInvalidConfig)
	}
	if cfg.QueueURL == nil {
		return nil, fmt.Errorf("%w: PublisherConfig.QueueURL is required", ErrInvalidConfig)
	}
	return &Publisher{api: api, cfg: cfg}, nil
}

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
		idx := byQueue[q]
		for len(idx) > 0 {
			n := min(len(idx), maxBatch)
			p.sendBatch(ctx, q, msgs, idx[:n], res)
			idx = idx[n:]
		}
	}
	return res
}

// sendBatch sends msgs[idx...] to queue in one call and fills their results.
func (p *Publisher) sendBatch(ctx context.Context, queue string, msgs []broker.Message, idx []int, res []broker.Result) {
	entries := make([]types.SendMessageBatchRequestEntry, 0, len(idx))
	for _, i := range idx {
		e, err := p.entry(strconv.Itoa(i), msgs[i])
		if err != nil {
			res[i].Err = err
			continue
		}
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		return
	}
	out, err := p.api.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queue), Entries: entries})
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
