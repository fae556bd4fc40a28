package sqsbroker

import (
	"encoding/base64"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/uuid"

	"github.com/oncekit/oncekit/broker"
)

// A payload SQS cannot carry as a body goes base64-encoded and marked; a
// FIFO entry carries the event ID as its deduplication ID and the key as
// its group.
func TestEntry(t *testing.T) {
	id := uuid.New()
	p := &Publisher{cfg: PublisherConfig{FIFO: true}}
	for _, tc := range []struct {
		payload []byte
		base64  bool
	}{
		{[]byte(`{"n":1}`), false},
		{[]byte("\xff\x00"), true},
		{[]byte("a\x01b"), true},
	} {
		e, err := p.entry("0", broker.Message{ID: id, Subject: "payments", Key: "order-7", Payload: tc.payload})
		if err != nil {
			t.Fatal(err)
		}
		_, marked := e.MessageAttributes[AttrBodyEncoding]
		if marked != tc.base64 {
			t.Errorf("%q: base64 %v, want %v", tc.payload, marked, tc.base64)
		}
		if tc.base64 && aws.ToString(e.MessageBody) != base64.StdEncoding.EncodeToString(tc.payload) {
			t.Errorf("%q: body %q", tc.payload, aws.ToString(e.MessageBody))
		}
		if aws.ToString(e.MessageBody) == "" {
			t.Errorf("%q: empty body", tc.payload)
		}
		if aws.ToString(e.MessageDeduplicationId) != id.String() || aws.ToString(e.MessageGroupId) != "order-7" {
			t.Errorf("FIFO attributes: %q, %q", aws.ToString(e.MessageDeduplicationId), aws.ToString(e.MessageGroupId))
		}
	}
	e, err := p.entry("0", broker.Message{ID: id, Subject: "payments"})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(e.MessageBody) == "" || aws.ToString(e.MessageAttributes[AttrBodyEncoding].StringValue) != "empty" {
		t.Errorf("empty payload: body %q", aws.ToString(e.MessageBody))
	}
	if aws.ToString(e.MessageGroupId) != "payments" {
		t.Errorf("a message without a key is grouped by its subject, not %q", aws.ToString(e.MessageGroupId))
	}
}
