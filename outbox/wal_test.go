package outbox

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
)

// A message written into the WAL reads back as it was: ID, key, subject,
// headers and payload, empty ones included.
func TestWALMessageRoundTrip(t *testing.T) {
	for _, m := range []broker.Message{
		{ID: uuid.New(), Subject: "orders.created", Key: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		{ID: uuid.New(), Subject: "a"},
		{ID: uuid.New(), Subject: "b", Payload: make([]byte, 70000), Key: string(make([]byte, 300))},
	} {
		b, err := walEncode(m)
		require.NoError(t, err)
		got, err := walDecode(b)
		require.NoError(t, err)
		if len(m.Payload) == 0 {
			m.Payload = got.Payload // nil and empty are one
		}
		require.Equal(t, m, got)
	}
}

// Content under the outbox's prefix that Enqueue did not write (another
// writer's pg_logical_emit_message) is refused without a panic, whatever
// its bytes.
func FuzzWALDecode(f *testing.F) {
	good, _ := walEncode(broker.Message{ID: uuid.New(), Subject: "s", Key: "k", Payload: []byte("p"), Headers: map[string]string{"a": "b"}})
	for _, seed := range [][]byte{good, nil, {walVersion}, {2}, good[:20], append(append([]byte{}, good[:17]...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := walDecode(b)
		if err == nil {
			again, err := walEncode(m)
			require.NoError(t, err)
			_, err = walDecode(again)
			require.NoError(t, err)
		}
	})
}
