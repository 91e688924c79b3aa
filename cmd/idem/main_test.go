package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

// base is the engine clock of the fixture's live records: an hour ago, whole
// seconds, so the tool (on the real clock) sees them inside the window and
// their times print exactly.
var base = time.Now().UTC().Truncate(time.Second).Add(-time.Hour)

const (
	baseFmt    = "2006-01-02T15:04:05Z07:00"
	orderResp  = `{"order":"o-1"}`
	binaryResp = "\xff\x00\xfe"
)

// fixture creates an idem file holding, on the fixture clock:
//
//	order-1  done, response {"order":"o-1"}
//	order-2  done, stored error card_declined
//	order-3  started: fn panicked (an interrupted execution)
//	empty    done, empty response
//	nil-resp done, no response
//	binary   done, a response that is not UTF-8
//	old      done three days ago: expired, not pruned yet
func fixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	doAll(t, path, base, map[string]func(context.Context) ([]byte, error){
		"order-1": func(context.Context) ([]byte, error) { return []byte(orderResp), nil },
		"order-2": func(context.Context) ([]byte, error) {
			return nil, idem.WithCode(errors.New("card declined"), "card_declined")
		},
		"order-3":  func(context.Context) ([]byte, error) { panic("crash in the middle") },
		"empty":    func(context.Context) ([]byte, error) { return []byte{}, nil },
		"nil-resp": func(context.Context) ([]byte, error) { return nil, nil },
		"binary":   func(context.Context) ([]byte, error) { return []byte(binaryResp), nil },
	})
	doAll(t, path, base.Add(-72*time.Hour), map[string]func(context.Context) ([]byte, error){
		"old": func(context.Context) ([]byte, error) { return []byte("stale"), nil },
	})
	return path
}

// doAll runs Do for every key on an engine whose clock stands at now,
// recovering fn's panics, and closes it.
func doAll(t *testing.T, path string, now time.Time, fns map[string]func(context.Context) ([]byte, error)) {
	t.Helper()
	e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1, Now: func() time.Time { return now }})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	for key, fn := range fns {
		func() {
			defer func() { _ = recover() }()
			_, _ = e.Do(context.Background(), key, []byte("args of "+key), fn)
		}()
	}
}

// corrupt writes garbage as a record of key in the newest time slot, directly
// with bbolt.
func corrupt(t *testing.T, path, key string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		root := tx.Bucket(rootBucket)
		name, _ := root.Cursor().Seek(slotPrefix) // a slot bucket: the tests write in one slot
		return root.Bucket(name).Put([]byte(key), []byte("not a record at all"))
	}))
}

type result struct {
	code           int
	stdout, stderr string
}

// idemCmd runs the tool in-process, with no environment but env.
func idemCmd(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return env[k] },
		strings.NewReader(stdin), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

func idemDB(t *testing.T, path string, args ...string) result {
	t.Helper()
	return idemCmd(t, nil, "", append([]string{"--db", path}, args...)...)
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&v), "output: %s", s)
	require.False(t, dec.More(), "one JSON document")
	return v
}

// row returns the fields of the line of an ls table that starts with key.
func row(t *testing.T, out, key string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == key {
			return f
		}
	}
	t.Fatalf("no row %q in:\n%s", key, out)
	return nil
}

func TestHumanOutput(t *testing.T) {
	t.Parallel()
	started := base.Format(baseFmt)
	expires := base.Add(idem.DefaultRetention).Format(baseFmt)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, stdout string)
	}{
		{"stats counts live records by state, expired and corrupt ones", []string{"stats"}, func(t *testing.T, out string) {
			require.Regexp(t, `file +\S+idem\.db \(\d+\.\d KiB\)\n`, out)
			require.Contains(t, out, "records  6 live: 1 started, 5 done\n")
			require.Contains(t, out, "expired  1 awaiting prune (each record's own retention window)\n")
			require.Contains(t, out, "corrupt  0\n")
		}},
		{"ls lists live records sorted by key with their columns", []string{"ls"}, func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Equal(t, []string{"KEY", "STATE", "ATTEMPT", "STARTED", "COMPLETED", "EXPIRES", "RESPONSE", "ERROR"}, strings.Fields(lines[0]))
			var keys []string
			for _, l := range lines[1:] {
				keys = append(keys, strings.Fields(l)[0])
			}
			require.Equal(t, []string{"binary", "empty", "nil-resp", "order-1", "order-2", "order-3"}, keys)
			require.Equal(t, []string{"order-1", "done", "1", started, started, expires, "15", "B", "-"}, row(t, out, "order-1"))
			require.Equal(t, []string{"order-2", "done", "1", started, started, expires, "-", "card_declined"}, row(t, out, "order-2"))
			require.Equal(t, []string{"order-3", "started", "1", started, "-", expires, "-", "-"}, row(t, out, "order-3"))
			require.Equal(t, []string{"empty", "done", "1", started, started, expires, "0", "B", "-"}, row(t, out, "empty"))
			require.NotContains(t, out, "old", "an expired record is absent")
			require.NotContains(t, out, "o-1", "ls prints no response")
		}},
		{"ls --state started lists only interrupted executions", []string{"ls", "--state", "started"}, func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Len(t, lines, 2)
			require.Equal(t, "order-3", strings.Fields(lines[1])[0])
		}},
		{"ls --limit lists the first keys and says how many matched", []string{"ls", "--state", "done", "--limit", "2"}, func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Len(t, lines, 4)
			require.Equal(t, "binary", strings.Fields(lines[1])[0])
			require.Equal(t, "empty", strings.Fields(lines[2])[0])
			require.Equal(t, "(2 of 5 records; raise --limit for more)", lines[3])
		}},
		{"ls --recovery refuse shows that interrupted executions never expire", []string{"--recovery", "refuse", "ls", "--state", "started"}, func(t *testing.T, out string) {
			require.Equal(t, []string{"order-3", "started", "1", started, "-", "never", "-", "-"}, row(t, out, "order-3"))
		}},
		{"ls with a long retention lists the old record", []string{"--retention", "100h", "ls", "--state", "done"}, func(t *testing.T, out string) {
			require.Equal(t, "old", row(t, out, "old")[0])
		}},
		{"get shows a done record and its response", []string{"get", "order-1"}, func(t *testing.T, out string) {
			require.Equal(t, "key          order-1\n"+
				"state        done\n"+
				"attempt      1\n"+
				"fingerprint  "+fingerprint("order-1")+"\n"+
				"started      "+started+"\n"+
				"completed    "+started+"\n"+
				"expires      "+expires+"\n"+
				"retention    24h0m0s\n"+
				"error        -\n"+
				"response     15 B\n"+
				orderResp+"\n", out)
		}},
		{"get shows a stored error with its code", []string{"get", "order-2"}, func(t *testing.T, out string) {
			require.Contains(t, out, "error        card_declined: card declined\n")
			require.Contains(t, out, "response     none\n")
		}},
		{"get shows a started record without completion", []string{"get", "order-3"}, func(t *testing.T, out string) {
			require.Contains(t, out, "state        started\n")
			require.Contains(t, out, "completed    -\n")
		}},
		{"get tells an empty response from none", []string{"get", "empty"}, func(t *testing.T, out string) {
			require.True(t, strings.HasSuffix(out, "response     0 B\n"), out)
		}},
		{"get shows a binary response in base64", []string{"get", "binary"}, func(t *testing.T, out string) {
			require.Contains(t, out, "response     3 B, not UTF-8; base64 below (or get --raw)\n/wD+\n")
		}},
		{"get --raw writes the response bytes only", []string{"get", "--raw", "binary"}, func(t *testing.T, out string) {
			require.Equal(t, binaryResp, out)
		}},
		{"check passes on a healthy file", []string{"check"}, func(t *testing.T, out string) {
			require.Contains(t, out, "pages    ok (bbolt consistency check)\n")
			require.Contains(t, out, "records  7 decoded: 1 started, 5 done, 1 expired awaiting prune\n")
			require.Contains(t, out, "corrupt  0\n")
			require.Regexp(t, `ok: \S+idem\.db\n$`, out)
		}},
		{"prune removes the expired record", []string{"prune"}, func(t *testing.T, out string) {
			require.Equal(t, "pruned 1 expired record (the file keeps its size; idem compact shrinks it)\n", out)
		}},
		{"forget deletes a record", []string{"forget", "order-1"}, func(t *testing.T, out string) {
			require.Equal(t, "forgot order-1: the next call with this key runs as new\n", out)
		}},
		{"resolve completes an interrupted execution", []string{"resolve", "order-3", "--response", "ok"}, func(t *testing.T, out string) {
			require.Equal(t, "resolved order-3: done, with a response of 2 B; later calls replay it\n", out)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemDB(t, fixture(t), tt.args...)
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			require.Empty(t, r.stderr)
			tt.check(t, r.stdout)
		})
	}
}

// fingerprint is the hex xxhash of the fixture's fingerprint bytes for key.
func fingerprint(key string) string {
	return fmt.Sprintf("%016x", xxhash.Sum64String("args of "+key))
}

func TestJSONOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, stdout string)
	}{
		{"stats", []string{"stats"}, func(t *testing.T, out string) {
			s := decode[statsJSON](t, out)
			require.Positive(t, s.FileSize)
			require.Equal(t, "recorded", s.Retention, "each record's own window decides")
			require.Equal(t, 6, s.Records.Live)
			require.Equal(t, 1, s.Records.Started)
			require.Equal(t, 5, s.Records.Done)
			require.Equal(t, 1, s.Records.ExpiredPending)
			require.Equal(t, 0, s.Records.Corrupt)
		}},
		{"ls", []string{"ls"}, func(t *testing.T, out string) {
			l := decode[lsJSON](t, out)
			require.Equal(t, 6, l.Matched)
			require.Len(t, l.Records, 6)
			r := l.Records[3]
			require.Equal(t, "order-1", r.Key)
			require.Equal(t, "done", r.State)
			require.Equal(t, 1, r.Attempt)
			require.Len(t, r.Fingerprint, 16)
			require.Equal(t, base, r.StartedAt)
			require.Equal(t, base, *r.CompletedAt)
			require.Equal(t, base.Add(idem.DefaultRetention), *r.ExpiresAt)
			require.Equal(t, len(orderResp), *r.ResponseSize)
			require.Nil(t, r.Error)
			require.Equal(t, &errorJSON{Code: "card_declined", Message: "card declined"}, l.Records[4].Error)
			require.Nil(t, l.Records[5].CompletedAt, "started")
			require.Nil(t, l.Records[2].ResponseSize, "nil response")
			require.Equal(t, 0, *l.Records[1].ResponseSize, "empty response")
		}},
		{"ls with no match is an empty list", []string{"ls", "--state", "started", "--recovery", "refuse", "--limit", "0"}, func(t *testing.T, out string) {
			l := decode[lsJSON](t, out)
			require.Equal(t, 1, l.Matched)
		}},
		{"get of text", []string{"get", "order-1"}, func(t *testing.T, out string) {
			g := decode[getJSON](t, out)
			require.Equal(t, "order-1", g.Key)
			require.Equal(t, orderResp, *g.Response)
			require.Equal(t, "utf-8", g.ResponseEncoding)
		}},
		{"get of bytes", []string{"get", "binary"}, func(t *testing.T, out string) {
			g := decode[getJSON](t, out)
			require.Equal(t, "/wD+", *g.Response)
			require.Equal(t, "base64", g.ResponseEncoding)
		}},
		{"get of no response", []string{"get", "nil-resp"}, func(t *testing.T, out string) {
			require.Contains(t, out, `"response": null`)
		}},
		{"forget", []string{"forget", "order-1"}, func(t *testing.T, out string) {
			require.JSONEq(t, `{"key": "order-1", "forgotten": true}`, out)
		}},
		{"resolve", []string{"resolve", "order-3", "--response", "ok"}, func(t *testing.T, out string) {
			require.JSONEq(t, `{"key": "order-3", "state": "done", "response_size": 2, "error": null}`, out)
		}},
		{"prune", []string{"prune"}, func(t *testing.T, out string) {
			require.JSONEq(t, `{"pruned": 1, "interrupted": false}`, out)
		}},
		{"check", []string{"check"}, func(t *testing.T, out string) {
			c := decode[checkJSON](t, out)
			require.True(t, c.OK)
			require.True(t, c.Pages.OK)
			require.Empty(t, c.Pages.Errors)
			require.True(t, c.Records.Checked)
			require.Equal(t, 7, c.Records.Decoded)
			require.Equal(t, 1, c.Records.ExpiredPending)
			require.Empty(t, c.Records.Corrupt)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemDB(t, fixture(t), append([]string{"--json"}, tt.args...)...)
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			require.Empty(t, r.stderr)
			tt.check(t, r.stdout)
		})
	}
}

func TestForgetThenGetIsNotFound(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	require.Equal(t, 0, idemDB(t, path, "forget", "order-1").code)
	r := idemDB(t, path, "get", "order-1")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Equal(t, "idem: get \"order-1\": record not found\n", r.stderr)

	r = idemDB(t, path, "forget", "order-1")
	require.Equal(t, 1, r.code)
	require.Equal(t, "idem: forget \"order-1\": record not found\n", r.stderr)
}

func TestResolve(t *testing.T) {
	t.Parallel()
	respFile := filepath.Join(t.TempDir(), "resp")
	require.NoError(t, os.WriteFile(respFile, []byte("from a file"), 0o600))
	tests := []struct {
		name    string
		stdin   string
		args    []string
		wantGet getJSON
	}{
		{"with a response string", "", []string{"--response", "charged"},
			getJSON{Response: ptr("charged")}},
		{"with an empty response, which is not none", "", []string{"--response", ""},
			getJSON{Response: ptr("")}},
		{"with a response file", "", []string{"--response-file", respFile},
			getJSON{Response: ptr("from a file")}},
		{"with a response from stdin", "piped", []string{"--response-file", "-"},
			getJSON{Response: ptr("piped")}},
		{"as a stored error with a code", "", []string{"--code", "card_declined", "--error", "declined downstream"},
			getJSON{Error: &errorJSON{Code: "card_declined", Message: "declined downstream"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := fixture(t)
			r := idemCmd(t, nil, tt.stdin, append([]string{"--db", path, "resolve", "order-3"}, tt.args...)...)
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)

			g := decode[getJSON](t, idemDB(t, path, "--json", "get", "order-3").stdout)
			require.Equal(t, "done", g.State)
			require.Equal(t, tt.wantGet.Response, g.Response)
			require.Equal(t, tt.wantGet.Error, g.Error)

			// The engine replays the resolution.
			e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1})
			require.NoError(t, err)
			defer e.Close()
			res, err := e.Do(context.Background(), "order-3", []byte("args of order-3"), func(context.Context) ([]byte, error) {
				t.Fatal("fn ran again after resolve")
				return nil, nil
			})
			require.True(t, res.Replayed)
			if tt.wantGet.Error != nil {
				var ie *idem.Error
				require.ErrorAs(t, err, &ie)
				require.Equal(t, tt.wantGet.Error.Code, ie.Code)
			} else {
				require.NoError(t, err)
				require.Equal(t, *tt.wantGet.Response, string(res.Response))
				require.NotNil(t, res.Response)
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{"of a done record is refused", []string{"resolve", "order-1", "--response", "x"}, 1,
			"idem: resolve \"order-1\": record in the wrong state: the record is done, only an interrupted execution can be resolved\n"},
		{"of a missing key is not found", []string{"resolve", "nope", "--response", "x"}, 1,
			"idem: resolve \"nope\": record not found\n"},
		{"without an outcome is a usage error", []string{"resolve", "order-3"}, 2,
			"idem: resolve: say what the execution returned: --response, --response-file, or --error (with --code)\nRun 'idem --help' for usage.\n"},
		{"with both response flags is a usage error", []string{"resolve", "order-3", "--response", "x", "--response-file", "f"}, 2,
			"idem: resolve: give --response or --response-file, not both\nRun 'idem --help' for usage.\n"},
		{"without a key is a usage error", []string{"resolve", "--response", "x"}, 2,
			"idem: resolve: accepts 1 arg(s), received 0 (usage: idem resolve KEY (--response STRING | --response-file PATH | --error MESSAGE [--code CODE]) [flags])\nRun 'idem --help' for usage.\n"},
		{"with an unknown flag is a usage error", []string{"resolve", "order-3", "--bogus"}, 2,
			"idem: unknown flag: --bogus\nRun 'idem --help' for usage.\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := fixture(t)
			r := idemDB(t, path, tt.args...)
			require.Equal(t, tt.wantCode, r.code)
			require.Equal(t, tt.wantStderr, r.stderr)
			require.Empty(t, r.stdout)
			g := decode[getJSON](t, idemDB(t, path, "--json", "get", "order-3").stdout)
			require.Equal(t, "started", g.State, "unchanged")
		})
	}
}

func TestCheckFindsCorruptRecord(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	corrupt(t, path, "bad-key")

	r := idemDB(t, path, "check")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stderr)
	require.Contains(t, r.stdout, "pages    ok (bbolt consistency check)\n")
	require.Contains(t, r.stdout, "records  7 decoded: 1 started, 5 done, 1 expired awaiting prune\n")
	require.Contains(t, r.stdout, "corrupt  1\n           bad-key: corrupt record: 19 bytes is too short\n")
	require.Regexp(t, `FAILED: \S+idem\.db has 1 corrupt record\n$`, r.stdout)

	r = idemDB(t, path, "--json", "check")
	require.Equal(t, 1, r.code)
	c := decode[checkJSON](t, r.stdout)
	require.False(t, c.OK)
	require.True(t, c.Pages.OK)
	require.Equal(t, []corruptJSON{{Key: "bad-key", Error: "corrupt record: 19 bytes is too short"}}, c.Records.Corrupt)

	// The other commands count it, and list none of it.
	s := decode[statsJSON](t, idemDB(t, path, "--json", "stats").stdout)
	require.Equal(t, 1, s.Records.Corrupt)
	r = idemDB(t, path, "ls")
	require.Equal(t, 0, r.code)
	require.Equal(t, "idem: 1 corrupt record not listed; run idem check\n", r.stderr)
	require.NotContains(t, r.stdout, "bad-key")
}

func TestCheckPageDamageReadsNothingAndWritesNothing(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	pageSize := os.Getpagesize() // bbolt's page size for a new file
	for i := 2 * pageSize; i < len(b); i++ {
		b[i] = 0xde
	}
	require.NoError(t, os.WriteFile(path, b, 0o600))

	r := idemDB(t, path, "check")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stderr)
	require.Regexp(t, `^pages    \d+ errors?\n`, r.stdout)
	require.Contains(t, r.stdout, "records  not checked: the file has page-level damage; restore it from a backup\n")
	require.Regexp(t, `FAILED: \S+idem\.db has \d+ page-level errors?\n$`, r.stdout)

	c := decode[checkJSON](t, idemDB(t, path, "--json", "check").stdout)
	require.False(t, c.OK)
	require.False(t, c.Pages.OK)
	require.NotEmpty(t, c.Pages.Errors)
	require.False(t, c.Records.Checked)

	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, b, after, "check writes nothing")

	// Other commands end in one line, not a stack trace.
	r = idemDB(t, path, "ls")
	require.Equal(t, 1, r.code)
	require.Regexp(t, "^idem: open \\S+: corrupt record: the file is damaged \\(bbolt: .*\\); run `idem check` and restore from a backup\n$", r.stderr,
		"the engine reports bbolt's panic on the damaged page as an error")
}

func TestCheckNotAnIdemFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "other.db")
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("users")); return err }))
	require.NoError(t, db.Close())

	r := idemDB(t, path, "check")
	require.Equal(t, 1, r.code)
	require.Equal(t, "idem: "+path+": not an idem file (no \"idem\" bucket)\n", r.stderr,
		"a healthy file of another program is not reported as damaged")

	r = idemDB(t, path, "stats")
	require.Equal(t, 1, r.code)
	require.Equal(t, "idem: "+path+": not an idem file (no \"idem\" bucket)\n", r.stderr)

	// Nothing was added to the file.
	db, err = bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		require.Nil(t, tx.Bucket(rootBucket))
		return nil
	}))
}

// allCommands is one invocation of every command, against the file path.
func allCommands(path string) map[string][]string {
	return map[string][]string{
		"stats":   {"--db", path, "stats"},
		"ls":      {"--db", path, "ls"},
		"get":     {"--db", path, "get", "order-1"},
		"forget":  {"--db", path, "forget", "order-1"},
		"resolve": {"--db", path, "resolve", "order-3", "--response", "x"},
		"prune":   {"--db", path, "prune"},
		"check":   {"--db", path, "check"},
		"compact": {"compact", path, path + ".compact"},
	}
}

func TestFileInUseByAnotherProgram(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	requireInUse(t, path, allCommands(path))
}

// requireInUse holds path with an engine and checks that every command of
// commands (name → args), in human and JSON form, ends in the one-line
// in-use message on stderr and exit status 1, printing nothing else but,
// with --json, the error object on stdout.
func requireInUse(t *testing.T, path string, commands map[string][]string) {
	t.Helper()
	e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })

	want := "idem: " + path + " is in use by another program; the idem tool works on a file no program holds (stop the program, or inspect through it)\n"
	for name, args := range commands {
		for _, format := range []string{"human", "json"} {
			t.Run(name+" "+format, func(t *testing.T) {
				t.Parallel()
				a := args
				if format == "json" {
					a = append([]string{"--json"}, args...)
				}
				r := idemCmd(t, nil, "", a...)
				require.Equal(t, 1, r.code)
				require.Equal(t, want, r.stderr)
				if format == "human" {
					require.Empty(t, r.stdout)
					return
				}
				doc := decode[errorDocJSON](t, r.stdout)
				require.Equal(t, errorDoc{Message: strings.TrimSuffix(want, "\n"), Kind: "in_use", ExitStatus: 1}, doc.Error)
			})
		}
	}
}

func TestMissingFileIsNotCreated(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "missing.db")
	requireNotCreated(t, path, allCommands(path))
}

// requireNotCreated checks that every command of commands (name → args)
// on path, a file that does not exist, says so and creates nothing.
func requireNotCreated(t *testing.T, path string, commands map[string][]string) {
	t.Helper()
	for name, args := range commands {
		t.Run(name, func(t *testing.T) {
			r := idemCmd(t, nil, "", args...)
			require.Equal(t, 1, r.code)
			require.Equal(t, "idem: "+path+": no such file\n", r.stderr)
			require.Empty(t, r.stdout)
			_, err := os.Stat(path)
			require.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

func TestDBPathFromEnvironment(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	missing := filepath.Join(t.TempDir(), "missing.db")
	tests := []struct {
		name     string
		env      map[string]string
		args     []string
		wantCode int
	}{
		{"IDEM_DB names the file", map[string]string{"IDEM_DB": path}, []string{"get", "order-1"}, 0},
		{"--db wins over IDEM_DB", map[string]string{"IDEM_DB": missing}, []string{"--db", path, "get", "order-1"}, 0},
		{"the default is idem.db in the working directory", nil, []string{"get", "order-1"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemCmd(t, tt.env, "", tt.args...)
			require.Equal(t, tt.wantCode, r.code, "stderr: %s", r.stderr)
			if tt.wantCode != 0 {
				require.Equal(t, "idem: idem.db: no such file\n", r.stderr)
			}
		})
	}
}

func TestPruneThenStats(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	require.Equal(t, 0, idemDB(t, path, "prune").code)
	s := decode[statsJSON](t, idemDB(t, path, "--json", "stats").stdout)
	require.Equal(t, 0, s.Records.ExpiredPending)
	require.Equal(t, 6, s.Records.Live)
	r := decode[pruneJSON](t, idemDB(t, path, "--json", "prune").stdout)
	require.Equal(t, 0, r.Pruned)
}

func TestCompact(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	dst := filepath.Join(t.TempDir(), "compact.db")

	r := idemCmd(t, nil, "", "compact", path, dst)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Regexp(t, `^compacted \S+idem\.db \(\d+\.\d KiB\) into \S+compact\.db \(\d+\.\d KiB\): (\d+% smaller|no smaller)\n$`, r.stdout)

	before := decode[lsJSON](t, idemDB(t, path, "--json", "ls").stdout)
	after := decode[lsJSON](t, idemDB(t, dst, "--json", "ls").stdout)
	require.Equal(t, before, after)
	require.Equal(t, 0, idemDB(t, dst, "check").code)

	r = idemCmd(t, nil, "", "compact", path, dst)
	require.Equal(t, 1, r.code)
	require.Equal(t, "idem: "+dst+" exists; compact writes a new file\n", r.stderr)

	dst2 := filepath.Join(t.TempDir(), "compact2.db")
	r = idemCmd(t, nil, "", "--json", "compact", path, dst2)
	require.Equal(t, 0, r.code)
	c := decode[compactJSON](t, r.stdout)
	require.Equal(t, path, c.Src)
	require.Equal(t, dst2, c.Dst)
	require.Positive(t, c.SrcSize)
	require.Positive(t, c.DstSize)
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	tests := []struct {
		name       string
		args       []string
		wantStderr string
	}{
		{"unknown state", []string{"ls", "--state", "running"}, "idem: --state: unknown state \"running\" (want started or done)\n"},
		{"negative limit", []string{"ls", "--limit", "-1"}, "idem: --limit must not be negative\n"},
		{"negative retention", []string{"--retention", "-1s", "stats"}, "idem: --retention must not be negative, not -1s\n"},
		{"unknown recovery policy", []string{"--recovery", "maybe", "stats"}, "idem: --recovery must be reexecute or refuse, not \"maybe\"\n"},
		{"extra argument", []string{"stats", "extra"}, "idem: stats: unknown command \"extra\" for \"idem stats\" (usage: idem stats [flags])\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemDB(t, path, tt.args...)
			require.Equal(t, 2, r.code)
			require.Equal(t, tt.wantStderr+"Run 'idem --help' for usage.\n", r.stderr)
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestRendering(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, got, want string
	}{
		{"a plain key prints as it is", quoteKey("order-1"), "order-1"},
		{"a key with a space is quoted", quoteKey("order 1"), `"order 1"`},
		{"a key with a control character is quoted", quoteKey("a\tb\n"), `"a\tb\n"`},
		{"a key with a quote is quoted", quoteKey(`a"b`), `"a\"b"`},
		{"a non-ASCII key prints as it is", quoteKey("commande-é"), "commande-é"},
		{"bytes under a KiB", fmtBytes(1023), "1023 B"},
		{"KiB", fmtBytes(40960), "40.0 KiB"},
		{"MiB", fmtBytes(3 << 20), "3.0 MiB"},
		{"engine errors lose their repeated prefix", errorLine(&idem.OpError{Op: "get", Key: "k", Err: idem.ErrNotFound}), `idem: get "k": record not found`},
		{"a key that looks like a prefix is kept", errorLine(&idem.OpError{Op: "get", Key: "x: idem: y", Err: idem.ErrNotFound}), `idem: get "x: idem: y": record not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.got)
		})
	}
}

func TestCheckFindsCorruptOutboxMessages(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(rootBucket).Bucket(outboxBucket).Put(seqKey(77), []byte("not a message"))
	}))
	require.NoError(t, db.Close())
	r := idemDB(t, path, "check")
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.stdout, "FAILED: "+path+" has 1 corrupt outbox message\n")
}

// TestErrorsHaveOnePrefix is issue 9's table through the CLI: every error
// line, a library error printed as it is or the CLI's own, reads "idem:"
// once.
func TestErrorsHaveOnePrefix(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	corrupt(t, path, "broken")
	notIdem := filepath.Join(t.TempDir(), "other.db")
	db, err := bbolt.Open(notIdem, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	long := strings.Repeat("k", 300)
	for _, args := range [][]string{
		{"--db", path, "get", "nope"},                           // ErrNotFound
		{"--db", path, "get", long},                             // ErrInvalidKey, a long key
		{"--db", path, "get", "broken"},                         // ErrCorrupt
		{"--db", path, "forget", "nope"},                        // ErrNotFound
		{"--db", path, "resolve", "order-1", "--response", "x"}, // ErrState
		{"--db", path, "resolve", "", "--response", "x"},        // ErrInvalidKey
		{"--db", path, "outbox", "retry", "99"},                 // ErrMessageNotFound
		{"--db", path, "outbox", "drop", "99"},                  // ErrMessageNotFound
		{"--db", path, "outbox", "get", "99"},
		{"--db", notIdem, "get", "k"}, // ErrFormat
		{"--db", notIdem, "stats"},    // ErrFormat
	} {
		r := idemCmd(t, nil, "", args...)
		require.NotZero(t, r.code, "%q", args)
		require.NotEmpty(t, r.stderr, "%q", args)
		for _, line := range strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n") {
			if strings.HasPrefix(line, "Run 'idem --help'") {
				continue
			}
			require.True(t, strings.HasPrefix(line, "idem: "), "%q: %s", args, line)
			require.Equal(t, 1, strings.Count(line, "idem:"), "%q: %s", args, line)
		}
		j := idemCmd(t, nil, "", append([]string{"--json"}, args...)...)
		require.LessOrEqual(t, strings.Count(j.stdout, "idem:"), 1, "%q --json: %s", args, j.stdout)
	}
}
