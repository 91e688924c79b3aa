package idemtest

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// keys holds the key rules (DESIGN.md, contract 1): a bad key is refused
// with ErrInvalidKey by every call, before anything is stored, so the call
// can be corrected and retried.
func (s *suite[T]) keys(t *testing.T) {
	// refusedByCalls checks that Do and DoTx refuse key.
	refusedByCalls := func(t *testing.T, e Engine[T], key string) {
		t.Helper()
		for _, v := range []via{viaDo, viaDoTx} {
			_, err := call(bg, e, v, key, fp, mustNotRun[T](t))
			require.ErrorIs(t, err, idemcore.ErrInvalidKey, "%s(%q)", v, key)
		}
	}
	refused := func(t *testing.T, e Engine[T], key string) {
		t.Helper()
		refusedByCalls(t, e, key)
		_, err := e.Get(key)
		require.ErrorIs(t, err, idemcore.ErrInvalidKey, "Get(%q)", key)
		require.ErrorIs(t, e.Forget(key), idemcore.ErrInvalidKey, "Forget(%q)", key)
		require.ErrorIs(t, e.Resolve(key, nil, nil), idemcore.ErrInvalidKey, "Resolve(%q)", key)
	}
	storesNothing := func(t *testing.T, e Engine[T]) {
		t.Helper()
		require.Empty(t, records(t, e))
		require.Empty(t, s.effects(t, e))
	}

	t.Run("valid keys", func(t *testing.T) {
		e, _ := s.fresh(t, Options{})
		for _, key := range []string{"a", strings.Repeat("k", idemcore.MaxKeyLen), "commande-été-42", "order 42", "sha256:ab/0"} {
			for _, v := range []via{viaDo, viaDoTx} {
				k := key
				if v == viaDoTx {
					k = "t" + key[1:]
				}
				res, err := call(bg, e, v, k, fp, ok[T]("v"))
				require.NoError(t, err, "%q", k)
				require.Equal(t, "v", string(res.Response))
				require.Equal(t, k, record(t, e, k).Key)
			}
		}
	})

	t.Run("empty, too long or not UTF-8", func(t *testing.T) {
		e, _ := s.fresh(t, Options{})
		for _, key := range []string{"", strings.Repeat("k", idemcore.MaxKeyLen+1), "k\xff", "\xc3"} {
			refused(t, e, key)
		}
		storesNothing(t, e)
	})

	t.Run("blank, padded, control or format characters", func(t *testing.T) {
		e, _ := s.fresh(t, Options{})
		// Refused, not trimmed: trimming would merge keys stored apart.
		// Operator calls still reach records stored under such keys before
		// the rule: for them the key is merely absent.
		for _, key := range []string{"   ", "\t\n", "\x00", "\ufeff", " k", "k ", " k ", "k\n", "a\x7fb", "a\u200bb", "a\u202eb"} {
			refusedByCalls(t, e, key)
			_, err := e.Get(key)
			require.ErrorIs(t, err, idemcore.ErrNotFound, "Get(%q)", key)
			require.ErrorIs(t, e.Forget(key), idemcore.ErrNotFound, "Forget(%q)", key)
			require.ErrorIs(t, e.Resolve(key, nil, nil), idemcore.ErrNotFound, "Resolve(%q)", key)
		}
		storesNothing(t, e)
	})

	t.Run("a bad key stores nothing and the call can be retried", func(t *testing.T) {
		e, _ := s.fresh(t, Options{})
		_, err := e.Do(bg, "", fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.ErrorIs(t, err, idemcore.ErrInvalidKey)
		res, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
		require.False(t, res.Replayed)
	})
}
