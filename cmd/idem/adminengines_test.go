package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempg"
)

// adminEngine is an engine the admin handler serves, with the calls this
// test makes on it.
type adminEngine interface {
	idemhttp.Operator
	idem.Doer
}

// TestAdminServesEitherEngine: idemhttp.Admin over the bbolt engine (a
// FileScanner) and over idempg's (which is not): the same answers to the
// same calls, /stats counted by the scan or by walks.
func TestAdminServesEitherEngine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	engines := map[string]func(t *testing.T) (adminEngine, func(key string, payload []byte) error){
		"bbolt": func(t *testing.T) (adminEngine, func(string, []byte) error) {
			e, err := idem.OpenFile(filepath.Join(t.TempDir(), "idem.db"), &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, e.Close()) })
			return e, func(key string, payload []byte) error {
				_, err := e.DoTx(ctx, key, []byte(key), func(_ context.Context, tx *idem.Tx) ([]byte, error) {
					return nil, tx.Enqueue("ship", payload)
				})
				return err
			}
		},
		"postgres": func(t *testing.T) (adminEngine, func(string, []byte) error) {
			dsn, schema := testPG(t, "IDEM_TEST_PG")
			pool := newPool(t, dsn)
			_, err := idempg.Migrate(ctx, pool, &idempg.Options{Schema: schema})
			require.NoError(t, err)
			e, err := idempg.Open(ctx, pool, &idempg.Options{Schema: schema}, &idem.Options{PruneInterval: -1})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, e.Close()) })
			return e, func(key string, payload []byte) error {
				_, err := e.DoTx(ctx, key, []byte(key), func(_ context.Context, tx pgx.Tx) ([]byte, error) {
					return nil, idempg.Enqueue(tx, "ship", payload)
				})
				return err
			}
		},
	}
	for name, open := range engines {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e, enqueue := open(t)
			_, err := e.Do(ctx, "order-1", []byte("a"), func(context.Context) ([]byte, error) { return []byte("charged"), nil })
			require.NoError(t, err)
			_, err = e.Do(ctx, "order-2", []byte("b"), func(context.Context) ([]byte, error) {
				return nil, idem.WithCode(errors.New("declined"), "card_declined")
			})
			require.Error(t, err)
			require.NoError(t, enqueue("order-3", []byte("parcel")))

			srv := httptest.NewServer(idemhttp.Admin(e, &idemhttp.AdminOptions{
				Authorize: idemhttp.AllowBearer(testToken), ShowResponses: true,
			}))
			t.Cleanup(srv.Close)
			call := func(method, route string, out any) {
				t.Helper()
				require.NoError(t, json.Unmarshal(adminOK(t, method, srv.URL+route), out))
			}

			var st idemhttp.AdminStats
			call(http.MethodGet, "/stats", &st)
			require.Equal(t, 3, st.Records.Done)
			require.Equal(t, 0, st.Records.Started)
			require.Equal(t, 1, st.Outbox.Pending)
			require.Equal(t, uint64(3), st.SinceOpen.Executions)

			var rec idemhttp.AdminRecord
			call(http.MethodGet, "/records?key=order-1", &rec)
			require.Equal(t, "done", rec.State)
			require.Equal(t, "charged", *rec.Response)
			call(http.MethodGet, "/records?key=order-2", &rec)
			require.Equal(t, &idemhttp.AdminErrorJSON{Code: "card_declined", Message: "declined"}, rec.Error)

			var list idemhttp.AdminMessages
			call(http.MethodGet, "/outbox", &list)
			require.Len(t, list.Messages, 1)
			m := list.Messages[0]
			require.Equal(t, "ship", m.Topic)
			require.Equal(t, "order-3", m.Key)
			require.Equal(t, "parcel", *m.Payload)
			var one idemhttp.AdminMessage
			call(http.MethodGet, "/outbox/"+strconv.FormatUint(m.Seq, 10), &one)
			require.Equal(t, m, one)

			var forgot map[string]any
			call(http.MethodDelete, "/records?key=order-1", &forgot)
			_, err = e.Get("order-1")
			require.ErrorIs(t, err, idem.ErrNotFound)
		})
	}
}
