package idempg

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idemcore"
)

// The loader takes versions in increasing order, with gaps (a version
// numbered on another branch merges later), and refuses a repeated version
// or a name not of the form NNNN_name.sql.
func TestLoadMigrations(t *testing.T) {
	file := &fstest.MapFile{Data: []byte("SELECT 1")}
	ms, err := loadMigrations(fstest.MapFS{"migrations/0001_a.sql": file, "migrations/0002_b.sql": file, "migrations/0004_d.sql": file})
	if err != nil {
		t.Fatal(err)
	}
	var vs []int
	for _, m := range ms {
		vs = append(vs, m.version)
	}
	if !slices.Equal(vs, []int{1, 2, 4}) {
		t.Fatalf("versions %v, want [1 2 4]", vs)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"repeated":   {"migrations/0001_a.sql": file, "migrations/0001_b.sql": file},
		"unnumbered": {"migrations/init.sql": file},
		"short":      {"migrations/1_a.sql": file},
		"zero":       {"migrations/0000_a.sql": file},
		"none":       {},
	} {
		if _, err := loadMigrations(fsys); err == nil {
			t.Errorf("%s: loaded, want an error", name)
		}
	}
}

// traceTracer stores one trace context with every message and reports each
// delivery attempt's end.
type traceTracer struct {
	trace []byte
	ended chan idemcore.DeliveryOutcome
}

func (f *traceTracer) StartCall(ctx context.Context, _ idemcore.CallStart) context.Context {
	return ctx
}
func (f *traceTracer) EndCall(context.Context, idemcore.CallEnd)                       {}
func (f *traceTracer) StartFn(ctx context.Context, _ idemcore.FnStart) context.Context { return ctx }
func (f *traceTracer) EndFn(context.Context, idemcore.FnEnd)                           {}
func (f *traceTracer) StartDelivery(ctx context.Context, _ idemcore.DeliveryStart) context.Context {
	return ctx
}
func (f *traceTracer) EndDelivery(_ context.Context, e idemcore.DeliveryEnd) { f.ended <- e.Outcome }
func (f *traceTracer) MessageTrace(context.Context) []byte                   { return f.trace }

// TestMigrateFromVersion4WithMessages: a schema at version 4 with a pending
// message and a dead letter is refused at Open until Migrate applies the
// versions above it (6: the messages' trace context); its messages are then
// listed without one, and a message enqueued after carries its call's, kept
// when it dies and when it is retried.
func TestMigrateFromVersion4WithMessages(t *testing.T) {
	ctx := context.Background()
	pool, s, above := schemaAt(t, 4)
	at := time.Now().Add(-time.Minute).UnixNano()
	day := int64(24 * time.Hour)
	for _, st := range []struct {
		q    string
		args []any
	}{
		{`INSERT INTO {schema}.idem_outbox (key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, next_attempt_ns)
		VALUES ('v4', 0, 'v4', 'parked', 'pending', 0, '', $1::bigint, 0)`, []any{at}},
		{`INSERT INTO {schema}.idem_dead_letters (seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, dead_ns, retention_ns, expires_ns)
		VALUES (1000, 'v4', 1, 'v4', 'parked', 'dead', 5, 'gone', $1::bigint, $1::bigint, $2::bigint, $1::bigint + $2::bigint)`, []any{at, day}},
	} {
		if _, err := pool.Exec(ctx, s.sql(st.q), st.args...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(ctx, pool, &s.Options, nil); !errors.Is(err, ErrSchemaVersion) {
		t.Fatalf("Open of a version 4 schema: %v, want ErrSchemaVersion", err)
	}
	did, err := Migrate(ctx, pool, &s.Options)
	if err != nil || !slices.Equal(did, above) || !slices.Contains(did, 6) {
		t.Fatalf("Migrate from version 4: %v, %v; want %v, 6 among them", did, err, above)
	}

	tr := &traceTracer{trace: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), ended: make(chan idemcore.DeliveryOutcome, 4)}
	e, err := Open(ctx, pool, &s.Options, &idemcore.Options{PruneInterval: -1, Tracer: tr,
		Outbox: idemcore.OutboxOptions{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	list := func() map[string]*idemcore.Message {
		t.Helper()
		out := map[string]*idemcore.Message{}
		if err := e.Messages(func(m *idemcore.Message, err error) error {
			if err != nil {
				return err
			}
			out[string(m.Payload)] = m
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	old := list()
	if m := old["pending"]; m == nil || m.Trace != nil || m.EnqueuedAt.UnixNano() != at {
		t.Errorf("version 4's pending message after the migration: %+v; want it, no trace context", m)
	}
	if m := old["dead"]; m == nil || !m.Dead || m.Trace != nil || m.LastError != "gone" {
		t.Errorf("version 4's dead letter after the migration: %+v; want it, no trace context", m)
	}

	if _, err := e.DoTx(ctx, "traced", []byte("fp"), func(_ context.Context, tx pgx.Tx) ([]byte, error) {
		return nil, Enqueue(tx, "failing", []byte("traced"))
	}); err != nil {
		t.Fatal(err)
	}
	if m := list()["traced"]; m == nil || string(m.Trace) != string(tr.trace) {
		t.Fatalf("the message enqueued after the migration: %+v; want its call's trace context", m)
	}
	e.Handle("failing", func(context.Context, idemcore.Message) error { return errors.New("down") })
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Dispatch(dctx) }()
	if o := <-tr.ended; o != idemcore.DeliveryDeadLetter {
		t.Fatalf("the failing delivery ended %v, want dead_letter", o)
	}
	cancel()
	<-done
	m := list()["traced"]
	if m == nil || !m.Dead || string(m.Trace) != string(tr.trace) {
		t.Fatalf("the dead letter: %+v; want it dead with its trace context", m)
	}
	if err := e.RetryDead(m.Seq); err != nil {
		t.Fatal(err)
	}
	if m := list()["traced"]; m == nil || m.Dead || string(m.Trace) != string(tr.trace) {
		t.Fatalf("the retried dead letter: %+v; want it pending with its trace context", m)
	}

	// The column holds at most idemcore.MaxMessageTrace bytes.
	_, err = pool.Exec(ctx, s.sql(`UPDATE {schema}.idem_outbox SET trace = $1::bytea`), strings.Repeat("x", idemcore.MaxMessageTrace+1))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" {
		t.Errorf("a trace context of %d bytes: %v, want check_violation", idemcore.MaxMessageTrace+1, err)
	}
}
