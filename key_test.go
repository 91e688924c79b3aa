package idem_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// TestKeyRules: Do and DoTx refuse blank keys, white space at either end and
// invisible characters (Unicode Cc and Cf), and store nothing; other keys,
// inner white space and non-ASCII included, are accepted.
func TestKeyRules(t *testing.T) {
	calls := map[string]func(e *idem.Engine, key string) error{
		"Do": func(e *idem.Engine, key string) error {
			_, err := e.Do(bg, key, []byte("fp"), okFn("v"))
			return err
		},
		"DoTx": func(e *idem.Engine, key string) error {
			_, err := e.DoTx(bg, key, []byte("fp"), func(context.Context, *idem.Tx) ([]byte, error) { return []byte("v"), nil })
			return err
		},
	}
	refused := map[string]string{
		"empty":                       "",
		"spaces only":                 "   ",
		"tab and newline":             "\t\n",
		"NUL":                         "\x00",
		"a lone byte-order mark":      "\ufeff",
		"leading space":               " k",
		"trailing space":              "k ",
		"both ends":                   " k ",
		"trailing newline":            "k\n",
		"leading no-break space":      "\u00a0k",
		"trailing line separator":     "k\u2028",
		"inner NUL":                   "k\x00k",
		"inner DEL (Cc)":              "k\x7fk",
		"inner zero-width space (Cf)": "k\u200bk",
		"inner byte-order mark":       "k\ufeffk",
		"soft hyphen (Cf)":            "k\u00adk",
		"too long":                    strings.Repeat("k", idem.MaxKeyLen+1),
		"not UTF-8":                   "k\xffk",
	}
	accepted := map[string]string{
		"plain":       "order-7f3a",
		"inner space": "order 7f3a",
		"non-ASCII":   "commande-é-7f3a",
		"the longest": strings.Repeat("k", idem.MaxKeyLen),
		"a KeyOf key": idem.KeyOf("create_order", " customer 9 ", "\x00"),
	}
	for callName, call := range calls {
		t.Run(callName, func(t *testing.T) {
			e, _ := boltkit.Open(t, nil)
			for name, key := range refused {
				err := call(e, key)
				require.ErrorIs(t, err, idem.ErrInvalidKey, "%s: %q", name, key)
			}
			s, err := e.ScanFile()
			require.NoError(t, err)
			require.Zero(t, s.Started+s.Done, "a refused key stores nothing")
			for name, key := range accepted {
				require.NoError(t, call(e, key), "%s: %q", name, key)
			}
			s, err = e.ScanFile()
			require.NoError(t, err)
			require.Equal(t, len(accepted), s.Done)
		})
	}
}

// TestOperatorCallsReachKeysStoredBefore: testdata/legacy-keys.db was written
// before the key rules refused white space and invisible characters; it
// holds done records under " k ", "\x00" and "k\ufeff" and interrupted ones
// under "\ufeff" and "\t\n" (all at 2100-01-01, so never expired). Get,
// Resolve and Forget still reach them; Do refuses the keys.
func TestOperatorCallsReachKeysStoredBefore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	copyTestdata(t, "legacy-keys.db", path)
	e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()); boltkit.Check(t, path) }()

	for _, key := range []string{" k ", "\x00", "k\ufeff"} {
		r, err := e.Get(key)
		require.NoError(t, err, "%q", key)
		require.Equal(t, idem.StateDone, r.State)
		require.Equal(t, "stored under "+strconv.Quote(key), string(r.Response))
		_, err = e.Do(bg, key, []byte("fp"), mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrInvalidKey, "%q: a new call with the key is refused", key)
	}

	require.NoError(t, e.Resolve("\ufeff", []byte("resolved"), nil))
	r, err := e.Get("\ufeff")
	require.NoError(t, err)
	require.Equal(t, idem.StateDone, r.State)
	require.Equal(t, "resolved", string(r.Response))

	r, err = e.Get("\t\n")
	require.NoError(t, err)
	require.Equal(t, idem.StateStarted, r.State)
	require.NoError(t, e.Forget("\t\n"))
	_, err = e.Get("\t\n")
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.NoError(t, e.Forget(" k "))
	_, err = e.Get(" k ")
	require.ErrorIs(t, err, idem.ErrNotFound)

	for _, key := range []string{"", strings.Repeat("k", idem.MaxKeyLen+1), "\xff"} {
		_, err := e.Get(key)
		require.ErrorIs(t, err, idem.ErrInvalidKey, "%q: no version stored such a key", key)
		require.ErrorIs(t, e.Forget(key), idem.ErrInvalidKey)
		require.ErrorIs(t, e.Resolve(key, nil, nil), idem.ErrInvalidKey)
	}
}

// copyTestdata copies testdata/name to dst, so a test never changes the
// committed file.
func copyTestdata(t *testing.T, name, dst string) {
	t.Helper()
	in, err := os.Open(filepath.Join("testdata", name))
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}
