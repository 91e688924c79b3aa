package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// TestResolveHTTPAnswer: --http-status and --http-header store the answer
// in idemhttp's format, the bytes EncodeResponse gives (which the
// middleware replays, tested in idemhttp); bad ones are usage errors that
// store nothing.
func TestResolveHTTPAnswer(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	for _, args := range [][]string{
		{"--http-status", "99"},
		{"--http-status", "200", "--http-header", "no colon"},
		{"--http-status", "200", "--http-header", "Set-Cookie: a=b"},
		{"--http-header", "X-A: b"},
		{"--http-status", "200", "--error", "boom"},
	} {
		r := idemCmd(t, nil, "", append([]string{"--db", path, "resolve", "order-3"}, args...)...)
		require.Equal(t, 2, r.code, "%q: %s", args, r.stderr)
	}
	e, err := idem.Open(path, nil)
	require.NoError(t, err)
	rec, err := e.Get("order-3")
	require.NoError(t, err)
	require.Equal(t, idem.StateStarted, rec.State, "a refused resolve stored nothing")
	require.NoError(t, e.Close())

	r := idemCmd(t, nil, "", "--db", path, "resolve", "order-3", "--http-status", "201",
		"--http-header", "Content-Type: application/json", "--http-header", "Location: /v1/orders/9", "--response", `{"id":9}`)
	require.Equal(t, 0, r.code, r.stderr)
	want, err := idemhttp.EncodeResponse(201, http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/orders/9"}}, []byte(`{"id":9}`))
	require.NoError(t, err)
	e, err = idem.Open(path, nil)
	require.NoError(t, err)
	defer e.Close()
	rec, err = e.Get("order-3")
	require.NoError(t, err)
	require.Equal(t, idem.StateDone, rec.State)
	require.Equal(t, want, rec.Response)
}
