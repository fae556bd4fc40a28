package natsjs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// streamSource is a test's stream (subjects name.>), a Source on its
// durable "d", and a publisher.
type streamSource struct {
	nats *testenv.NATS
	name string
	src  *natsjs.Source
	pub  *natsjs.Publisher
}

// newStreamSource creates the test's stream and a Source configured by cfg
// (Stream and Durable are set here), reading the subjects name.filter of
// filters (all when none).
func newStreamSource(t *testing.T, cfg natsjs.SourceConfig, filters ...string) *streamSource {
	t.Helper()
	ctx := context.Background()
	s := &streamSource{nats: testenv.NewNATS(t), name: testenv.Name(t)}
	_, err := natsjs.EnsureStream(ctx, s.nats.JS, natsjs.StreamConfig{Name: s.name, Subjects: []string{s.name + ".>"}})
	require.NoError(t, err)
	cfg.Stream, cfg.Durable = s.name, "d"
	for _, f := range filters {
		cfg.FilterSubjects = append(cfg.FilterSubjects, s.name+"."+f)
	}
	s.src, err = natsjs.NewSource(ctx, s.nats.JS, &cfg)
	require.NoError(t, err)
	t.Cleanup(s.src.Close)
	s.pub, err = natsjs.NewPublisher(s.nats.Conn, nil)
	require.NoError(t, err)
	return s
}
