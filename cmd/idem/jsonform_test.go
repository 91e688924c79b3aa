package main

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJSONFormSameAsAdmin: the CLI's --json and the admin handler print one
// form of a record and of an outbox message: for the same record (message),
// `idem --json get` (`outbox get`) on a file says what GET /records
// (/outbox/SEQ) of a running program holding a copy of it answers.
func TestJSONFormSameAsAdmin(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		fixture func(*testing.T) string
		args    []string
		route   string
	}{
		{"a done record, text", fixture, []string{"get", "order-1"}, "/records?key=order-1"},
		{"a record of bytes", fixture, []string{"get", "binary"}, "/records?key=binary"},
		{"a record without a response", fixture, []string{"get", "nil-resp"}, "/records?key=nil-resp"},
		{"a record with a stored error", fixture, []string{"get", "order-2"}, "/records?key=order-2"},
		{"an interrupted execution", fixture, []string{"get", "order-3"}, "/records?key=order-3"},
		{"a dead letter", outboxFixture, []string{"outbox", "get", "1"}, "/outbox/1"},
		{"a pending message that failed", outboxFixture, []string{"outbox", "get", "2"}, "/outbox/2"},
		{"a payload of bytes", outboxFixture, []string{"outbox", "get", "5"}, "/outbox/5"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := c.fixture(t)
			u, _ := serveAdmin(t, copyFixture(t, path), true)
			served := adminOK(t, http.MethodGet, u+c.route)

			r := idemDB(t, path, append([]string{"--json"}, c.args...)...)
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			require.JSONEq(t, string(served), r.stdout)
		})
	}
}

// adminOK sends method to the admin handler's URL u with testToken and
// returns the body of its 200 answer.
func adminOK(t *testing.T, method, u string) []byte {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", method, u, body)
	return body
}
