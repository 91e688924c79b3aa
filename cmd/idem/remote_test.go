package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

const testToken = "operator-token"

// serveAdmin opens an engine on path, as the running program would, and
// serves its admin handler on loopback under /admin/idem, guarded by
// testToken. It returns the handler's URL and the engine.
func serveAdmin(t *testing.T, path string, show bool) (string, *idem.Engine) {
	t.Helper()
	e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", idemhttp.Admin(e, &idemhttp.AdminOptions{
		Authorize: idemhttp.AllowBearer(testToken), ShowResponses: show,
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close() // the server first, then the engine
		require.NoError(t, e.Close())
	})
	return srv.URL + "/admin/idem", e
}

// copyFixture copies the idem file at src to a new file and returns its path.
func copyFixture(t *testing.T, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	dst := filepath.Join(t.TempDir(), "copy.db")
	require.NoError(t, os.WriteFile(dst, b, 0o600))
	return dst
}

func idemURL(t *testing.T, u, stdin string, args ...string) result {
	t.Helper()
	return idemCmd(t, map[string]string{"IDEM_TOKEN": testToken}, stdin, append([]string{"--url", u}, args...)...)
}

// TestRemoteSameAsFile runs each command on a file and, through --url, on a
// running program holding a copy of that file: the output, the exit status
// and the state afterwards are the same.
func TestRemoteSameAsFile(t *testing.T) {
	t.Parallel()
	records := [][]string{
		{"get", "order-1"}, {"--json", "get", "order-1"}, {"get", "binary"}, {"get", "--raw", "binary"},
		{"--json", "get", "binary"}, {"get", "nil-resp"}, {"--json", "get", "empty"}, {"get", "order-2"},
		{"--json", "get", "order-3"}, {"get", "old"}, {"get", "missing"}, {"get", ""},
		{"forget", "order-1"}, {"--json", "forget", "order-2"}, {"forget", "missing"},
		{"resolve", "order-3", "--response", "ok"}, {"--json", "resolve", "order-3", "--response", ""},
		{"resolve", "order-3", "--error", "declined downstream", "--code", "card_declined"},
		{"resolve", "order-3", "--response-file", "-"}, {"resolve", "order-1", "--response", "x"},
		{"resolve", "missing", "--response", "x"},
	}
	outbox := [][]string{
		{"outbox", "ls"}, {"outbox", "ls", "--dead"}, {"--json", "outbox", "ls"}, {"--json", "outbox", "ls", "--dead"},
		{"outbox", "ls", "--topic", "charge_card", "--limit", "1"}, {"outbox", "get", "1"}, {"outbox", "get", "5"},
		{"--json", "outbox", "get", "5"}, {"outbox", "get", "--raw", "2"}, {"outbox", "get", "99"},
		{"outbox", "retry", "1"}, {"outbox", "retry", "2", "1", "99", "1"}, {"outbox", "drop", "1"},
		{"--json", "outbox", "drop", "99", "1"}, {"outbox", "drop", "3"},
	}
	type tc struct {
		args    []string
		fixture func(*testing.T) string
		after   [][]string // read commands that compare the state afterwards
	}
	var cases []tc
	for _, args := range records {
		cases = append(cases, tc{args, fixture, [][]string{{"--json", "ls"}}})
	}
	for _, args := range outbox {
		cases = append(cases, tc{args, outboxFixture, [][]string{{"--json", "outbox", "ls"}, {"--json", "outbox", "ls", "--dead"}}})
	}
	// Damaged data: a corrupt record, a corrupt pending message (seq 8) and
	// a corrupt dead letter (seq 9).
	damaged := func(t *testing.T) string {
		path := outboxFixture(t)
		doAll(t, path, base, map[string]func(context.Context) ([]byte, error){
			"fine": func(context.Context) ([]byte, error) { return []byte("ok"), nil },
		})
		corrupt(t, path, "bad")
		corruptMessages(t, path)
		return path
	}
	for _, args := range [][]string{
		{"get", "bad"}, {"--json", "get", "bad"}, {"forget", "bad"}, {"resolve", "bad", "--response", "x"},
		{"outbox", "ls"}, {"outbox", "ls", "--dead"}, {"--json", "outbox", "ls", "--dead"},
		{"outbox", "get", "8"}, {"outbox", "get", "9"}, {"outbox", "retry", "9"}, {"outbox", "drop", "9", "8"},
	} {
		cases = append(cases, tc{args, damaged, [][]string{{"--json", "outbox", "ls", "--dead"}, {"--json", "get", "fine"}}})
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			local := c.fixture(t)
			online := copyFixture(t, local)
			const stdin = "resolved from stdin"
			want := idemCmd(t, nil, stdin, append([]string{"--db", local}, c.args...)...)

			u, e := serveAdmin(t, online, true)
			got := idemURL(t, u, stdin, c.args...)
			require.Equal(t, want, got)
			require.NoError(t, e.Close())
			for _, after := range c.after {
				require.Equal(t, stripNow(idemDB(t, local, after...)), stripNow(idemDB(t, online, after...)), "state after")
			}
		})
	}
}

// nowTime matches the times the commands stamp (a resolve's completion):
// the fixture's are whole seconds.
var nowTime = regexp.MustCompile(`"\d{4}-\d\d-\d\dT[0-9:]+\.\d+Z"`)

// stripNow blanks those times in r's output.
func stripNow(r result) result {
	r.stdout = nowTime.ReplaceAllString(r.stdout, `"now"`)
	return r
}

func TestRemoteStats(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	want := decode[statsJSON](t, idemDB(t, copyFixture(t, path), "--json", "stats").stdout)
	u, _ := serveAdmin(t, path, false)
	r := idemURL(t, u, "", "--json", "stats")
	require.Equal(t, 0, r.code, r.stderr)
	got := decode[statsJSON](t, r.stdout)
	require.Equal(t, u, got.Path)
	require.Positive(t, got.FileSize)
	want.Path, want.FileSize = got.Path, got.FileSize
	require.Equal(t, want, got)

	r = idemURL(t, u, "", "stats")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "file     "+u+" (")
	require.Contains(t, r.stdout, "6 live: 1 started, 5 done")
}

func TestRemoteHiddenResponses(t *testing.T) {
	t.Parallel()
	u, _ := serveAdmin(t, fixture(t), false)
	r := idemURL(t, u, "", "get", "order-1")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "response     15 B, "+hiddenNote+"\n")
	require.NotContains(t, r.stdout, orderResp)

	g := decode[getJSON](t, idemURL(t, u, "", "--json", "get", "order-1").stdout)
	require.True(t, g.ResponseHidden)
	require.Equal(t, len(orderResp), *g.ResponseSize)
	require.Nil(t, g.Response)

	r = idemURL(t, u, "", "get", "--raw", "order-1")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "the server hides the response")

	g = decode[getJSON](t, idemURL(t, u, "", "--json", "get", "nil-resp").stdout)
	require.False(t, g.ResponseHidden, "no response is not a hidden one")
	require.Nil(t, g.ResponseSize)

	u, _ = serveAdmin(t, outboxFixture(t), false)
	r = idemURL(t, u, "", "outbox", "get", "1")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "payload         44 B, "+hiddenNote+"\n")
	require.NotContains(t, r.stdout, "4242")
	o := decode[outboxGetJSON](t, idemURL(t, u, "", "--json", "outbox", "get", "1").stdout)
	require.True(t, o.PayloadHidden)
	require.Equal(t, len(cardPayload), *o.PayloadSize)
	r = idemURL(t, u, "", "outbox", "get", "--raw", "1")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "the server hides the payload")
	l := decode[outboxLsJSON](t, idemURL(t, u, "", "--json", "outbox", "ls", "--dead").stdout)
	require.Equal(t, len(cardPayload), *l.Messages[0].PayloadSize, "ls shows the size")
}

func TestRemoteAuthorization(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	u, e := serveAdmin(t, path, true)

	r := idemCmd(t, nil, "", "--url", u, "forget", "order-1")
	require.Equal(t, 1, r.code)
	require.Equal(t, "idem: "+u+": not authorized to read (HTTP 403; give a token with --token or $IDEM_TOKEN)\n", r.stderr)

	r = idemCmd(t, nil, "", "--url", u, "--token", "guess", "forget", "order-1")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "the server refused the token")
	_, err := e.Get("order-1")
	require.NoError(t, err, "nothing forgotten")

	r = idemCmd(t, nil, "", "--url", u, "--token", testToken, "forget", "order-1")
	require.Equal(t, 0, r.code, r.stderr)
	_, err = e.Get("order-1")
	require.ErrorIs(t, err, idem.ErrNotFound)

	// $IDEM_URL and $IDEM_TOKEN stand for the flags.
	r = idemCmd(t, map[string]string{"IDEM_URL": u, "IDEM_TOKEN": testToken}, "", "forget", "order-2")
	require.Equal(t, 0, r.code, r.stderr)
	_, err = e.Get("order-2")
	require.ErrorIs(t, err, idem.ErrNotFound)

	// --db wins over $IDEM_URL: the file is used (another one here).
	other := fixture(t)
	r = idemCmd(t, map[string]string{"IDEM_URL": u}, "", "--db", other, "forget", "binary")
	require.Equal(t, 0, r.code, r.stderr)
	_, err = e.Get("binary")
	require.NoError(t, err, "the program's record is untouched")
	require.Equal(t, 1, idemDB(t, other, "get", "binary").code, "forgotten in the file")
}

func TestRemoteUsage(t *testing.T) {
	t.Parallel()
	u, _ := serveAdmin(t, fixture(t), true)
	for name, args := range map[string][]string{
		"a file command":       {"--url", u, "ls"},
		"prune":                {"--url", u, "prune"},
		"check":                {"--url", u, "check"},
		"compact":              {"--url", u, "compact", "a", "b"},
		"both --db and --url":  {"--url", u, "--db", "x.db", "stats"},
		"not an http URL":      {"--url", "file:///tmp/idem.db", "stats"},
		"a URL without a host": {"--url", "http://", "stats"},
	} {
		r := idemCmd(t, nil, "", args...)
		require.Equal(t, 2, r.code, "%s: %s", name, r.stderr)
	}

	// A server that is not an admin handler, and no server at all.
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	r := idemURL(t, srv.URL, "", "stats")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "HTTP 404 Not Found")
	require.Contains(t, r.stderr, "not an idem admin handler")
	srv.Close()
	r = idemURL(t, srv.URL, "", "stats")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "connection refused")
}

func TestRemoteKeyInProgress(t *testing.T) {
	t.Parallel()
	u, e := serveAdmin(t, fixture(t), true)
	running, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), "slow", nil, func(context.Context) ([]byte, error) {
			close(running)
			<-release
			return []byte("ok"), nil
		})
		done <- err
	}()
	<-running
	forget := idemURL(t, u, "", "forget", "slow")
	resolve := idemURL(t, u, "", "resolve", "slow", "--response", "x")
	close(release)
	require.NoError(t, <-done)
	require.Equal(t, result{1, "", "idem: forget \"slow\": request in progress\n"}, forget)
	require.Equal(t, result{1, "", "idem: resolve \"slow\": request in progress\n"}, resolve)
	rec, err := e.Get("slow")
	require.NoError(t, err)
	require.Equal(t, []byte("ok"), rec.Response, "the running call kept its key")
}
