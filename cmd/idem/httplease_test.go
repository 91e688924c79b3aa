package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempg"
)

// TestHandlerSeesLeaseEnd: idemhttp's middleware on an idempg replica whose
// renewals cannot run (its pool's only connection is taken, as in a starved
// pool or on a blackholed connection). Once another replica has taken the
// key over (attempt 2, Recovered: the lease has passed by the database's
// clock), the handler's first look at its context finds it ended, with
// cause ErrLeaseLost, whether its client is still connected or went away
// before; going away did not end it (issue 18, item 2: a handler never runs
// on past its lease unknowingly).
func TestHandlerSeesLeaseEnd(t *testing.T) {
	t.Parallel()
	dsn, schema := testPG(t, "IDEM_TEST_PG")
	_, err := idempg.Migrate(context.Background(), newPool(t, dsn), &idempg.Options{Schema: schema})
	require.NoError(t, err)
	for _, gone := range []bool{false, true} {
		name := "client connected"
		if gone {
			name = "client gone"
		}
		t.Run(name, func(t *testing.T) { handlerAfterLease(t, dsn, schema, "order-"+name, gone) })
	}
}

// look is what a handler saw of its context.
type look struct {
	err, cause error
	call       idem.Call
	server     bool // the request's values: net/http's server is among them
}

func lookAt(ctx context.Context) look {
	c, _ := idem.CallFrom(ctx)
	return look{err: ctx.Err(), cause: context.Cause(ctx), call: c, server: ctx.Value(http.ServerContextKey) != nil}
}

func handlerAfterLease(t *testing.T, dsn, schema, key string, gone bool) {
	ctx := context.Background()
	// Replica A: one connection, which the test takes to stop its renewals.
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 1
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(poolA.Close)
	a, err := idempg.Open(ctx, poolA, &idempg.Options{Schema: schema, Lease: 2 * time.Second, PollInterval: 20 * time.Millisecond},
		&idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })

	reqCtx := make(chan context.Context, 1) // the request's own context, as net/http gave it
	handlerCtx := make(chan context.Context, 1)
	release := make(chan struct{})
	looked := make(chan look, 1)
	srvA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqCtx <- r.Context()
		idemhttp.Middleware(a, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handlerCtx <- r.Context()
			<-release
			looked <- lookAt(r.Context()) // the first look after the lease
			io.WriteString(w, "A")
		})).ServeHTTP(w, r)
	}))
	t.Cleanup(srvA.Close)

	post := func(ctx context.Context, url string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"sku":"A1"}`))
		require.NoError(t, err)
		req.Header.Set(idemhttp.HeaderKey, key)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req) // a hang guard, not an assertion
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), err
	}
	clientCtx, leave := context.WithCancel(ctx)
	defer leave()
	answerA := make(chan string, 1)
	go func() {
		s, err := post(clientCtx, srvA.URL)
		if err != nil {
			s = "error: " + err.Error()
		}
		answerA <- s
	}()
	rc, hc := <-reqCtx, <-handlerCtx
	if gone {
		leave()
		<-rc.Done() // the server saw the client go
		require.NoError(t, hc.Err(), "the handler's context ended because its client went away")
	}

	// A's renewals wait for the pool from now on.
	held, err := poolA.Acquire(ctx)
	require.NoError(t, err)
	released := false
	releaseConn := func() {
		if !released {
			released = true
			held.Release()
		}
	}
	defer releaseConn()

	// Replica B takes the key over once A's lease has passed.
	b, err := idempg.Open(ctx, newPool(t, dsn), &idempg.Options{Schema: schema, PollInterval: 20 * time.Millisecond}, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	srvB := httptest.NewServer(idemhttp.Middleware(b, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := idem.CallFrom(r.Context())
		fmt.Fprintf(w, "B attempt %d recovered %v", c.Attempt, c.Recovered)
	})))
	t.Cleanup(srvB.Close)
	answerB, err := post(ctx, srvB.URL)
	require.NoError(t, err)
	require.Equal(t, "200 B attempt 2 recovered true", answerB, "replica B's takeover")

	close(release)
	l := <-looked
	releaseConn()
	require.Error(t, l.err, "the handler's first look after its lease passed (and another replica took the key over) found its context live")
	require.ErrorIs(t, l.cause, idempg.ErrLeaseLost, "the handler's context ended with cause %v", l.cause)
	require.Equal(t, idem.Call{Key: key, Attempt: 1}, l.call, "idem.CallFrom on the handler's context")
	require.True(t, l.server, "the handler's context lost the request's values")
	if !gone {
		// Its caller gets the answer; it is not stored.
		require.Equal(t, "200 A", <-answerA)
	}
	rec, err := b.Get(key)
	require.NoError(t, err)
	require.Equal(t, 2, rec.Attempt, "the record is replica B's")
}

// newPool is a pool on dsn, closed when t ends.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}
