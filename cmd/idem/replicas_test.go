package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempg"
)

// pgOperator is an idempg engine as the admin handler's Operator: idempg
// has no Stats or ScanFile of its own, so this one counts what Records and
// Messages walk, and reports no counters.
type pgOperator struct{ *idempg.Engine }

func (o pgOperator) Stats() idem.Stats { return idem.Stats{} }

func (o pgOperator) ScanFile() (idem.FileStats, error) {
	var st idem.FileStats
	err := o.Records(func(r *idem.Record, err error) error {
		switch {
		case err != nil:
			st.Corrupt++
		case r.State == idem.StateStarted:
			st.Started++
		default:
			st.Done++
		}
		return nil
	})
	return st, err
}

// TestReplicasForgetThroughAdmin: two replicas of a service on one Postgres
// schema, each an idempg engine of its own (default options: the replay
// cache on) behind idemhttp's middleware and admin handler. An operator's
// `idem forget --url` on one replica is what the other replica's next
// request sees: it runs the handler again instead of replaying the answer
// the database no longer holds.
func TestReplicasForgetThroughAdmin(t *testing.T) {
	t.Parallel()
	dsn, schema := testPG(t, "IDEM_TEST_PG")
	ctx := context.Background()
	var runs atomic.Int32
	replica := func() string {
		pool, err := pgxpool.New(ctx, dsn)
		require.NoError(t, err)
		opts := &idempg.Options{Schema: schema}
		_, err = idempg.Migrate(ctx, pool, opts)
		require.NoError(t, err)
		e, err := idempg.Open(ctx, pool, opts, &idem.Options{PruneInterval: -1})
		require.NoError(t, err)
		mux := http.NewServeMux()
		mux.Handle("/v1/orders", idemhttp.Middleware(e, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "order run %d", runs.Add(1))
		})))
		mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", idemhttp.Admin(pgOperator{e}, &idemhttp.AdminOptions{Authorize: idemhttp.AllowBearer(testToken)})))
		srv := httptest.NewServer(mux)
		t.Cleanup(func() {
			srv.Close()
			require.NoError(t, e.Close())
			pool.Close()
		})
		return srv.URL
	}
	a, b := replica(), replica()
	post := func(base string) (string, bool) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(`{"sku":"A1"}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "order-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		return string(body), resp.Header.Get(idemhttp.HeaderReplayed) == "true"
	}

	body, replayed := post(a)
	require.Equal(t, "order run 1", body)
	require.False(t, replayed)
	body, replayed = post(a)
	require.Equal(t, "order run 1", body)
	require.True(t, replayed, "a retry on the same replica is replayed")

	r := idemURL(t, b+"/admin/idem", "", "forget", "order-1")
	require.Equal(t, 0, r.code, r.stderr)

	body, replayed = post(a)
	require.Equal(t, "order run 2", body, "the other replica runs the handler again after the forget")
	require.False(t, replayed)
	body, replayed = post(b)
	require.Equal(t, "order run 2", body)
	require.True(t, replayed)
}
