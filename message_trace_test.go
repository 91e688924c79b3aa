package idem_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemcore"
)

// fixedTrace is an idemcore.Tracer whose messages carry one trace context
// and that records the ones its deliveries get back.
type fixedTrace struct {
	trace     []byte
	delivered chan []byte
}

func (f *fixedTrace) StartCall(ctx context.Context, _ idemcore.CallStart) context.Context { return ctx }
func (f *fixedTrace) EndCall(context.Context, idemcore.CallEnd)                           {}
func (f *fixedTrace) StartFn(ctx context.Context, _ idemcore.FnStart) context.Context     { return ctx }
func (f *fixedTrace) EndFn(context.Context, idemcore.FnEnd)                               {}
func (f *fixedTrace) StartDelivery(ctx context.Context, s idemcore.DeliveryStart) context.Context {
	f.delivered <- s.Trace
	return ctx
}
func (f *fixedTrace) EndDelivery(context.Context, idemcore.DeliveryEnd) {}
func (f *fixedTrace) MessageTrace(context.Context) []byte               { return f.trace }

// testdata/file-v2-messages.db was written by the last build of format version 2
// (testdata/README.md): its messages are in message encoding version 1,
// without a trace context. This build opens it, lists and delivers them,
// moves the file to the current format version, and stores the trace context of the
// messages it enqueues.
func TestOpenFormatVersion2FileWithMessages(t *testing.T) {
	path := copyFixture(t, "testdata/file-v2-messages.db")
	written := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	now := func() time.Time { return written.Add(time.Hour) }
	tr := &fixedTrace{trace: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), delivered: make(chan []byte, 4)}
	e, err := idem.Open(path, &idem.Options{Now: now, Tracer: tr})
	require.NoError(t, err)
	defer e.Close()

	var msgs []*idem.Message
	require.NoError(t, e.Messages(func(m *idem.Message, err error) error {
		require.NoError(t, err)
		msgs = append(msgs, m)
		return nil
	}))
	require.Len(t, msgs, 2)
	pending, dead := msgs[0], msgs[1]
	require.Equal(t, "email", pending.Topic)
	require.Equal(t, "tx-1", pending.Key)
	require.Equal(t, "receipt o-tx", string(pending.Payload))
	require.False(t, pending.Dead)
	require.Nil(t, pending.Trace)
	require.Equal(t, "fail", dead.Topic)
	require.Equal(t, "order-9", dead.OrderingKey)
	require.True(t, dead.Dead)
	require.Equal(t, "mailer down", dead.LastError)
	require.Equal(t, idem.DefaultOutboxDeadLetterRetention, dead.DeadLetterRetention)
	require.Nil(t, dead.Trace)
	res, err := e.Do(bg, "tx-1", []byte("args-t"), mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, "tx-ok", string(res.Response))

	require.NoError(t, e.View(func(tx *bbolt.Tx) error {
		v := tx.Bucket([]byte("idem")).Bucket([]byte("meta")).Get([]byte("version"))
		require.Equal(t, uint32(4), binary.BigEndian.Uint32(v), "the open moves the file to the current format version (4)")
		return nil
	}))

	_, err = e.DoTx(bg, "tx-3", []byte("args-v"), func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		return nil, tx.Enqueue("email", []byte("receipt o-3"))
	})
	require.NoError(t, err)
	var traced *idem.Message
	require.NoError(t, e.Messages(func(m *idem.Message, err error) error {
		if m.Key == "tx-3" {
			traced = m
		}
		return err
	}))
	require.NotNil(t, traced)
	require.Equal(t, tr.trace, traced.Trace)

	// Both pending messages reach their handler, with the trace context
	// each was stored with.
	got := make(chan string, 2)
	e.Handle("email", func(_ context.Context, m idem.Message) error { got <- m.Key; return nil })
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- e.Dispatch(ctx) }()
	traces := map[string]bool{}
	for range 2 {
		<-got
		traces[string(<-tr.delivered)] = true
	}
	cancel()
	<-done
	require.Equal(t, map[string]bool{"": true, string(tr.trace): true}, traces)
}
