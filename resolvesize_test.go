package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// Resolve stores what fn would have returned, so the limit on what an
// outcome may store (Options.MaxResponseSize: the response plus the error's
// code and message) holds for it as for fn: an oversized resolution is
// refused with ErrResponseTooLarge and the interrupted execution stays as it
// was. Before, Resolve stored any size, past the limit the engine promises.

func TestResolveOverMaxResponseSizeIsRefused(t *testing.T) {
	e, _ := boltkit.Open(t, &idem.Options{MaxResponseSize: 10})
	interrupted := func(key string) {
		require.Panics(t, func() {
			_, _ = e.Do(bg, key, nil, func(context.Context) ([]byte, error) { panic("crash") })
		})
		require.Equal(t, idem.StateStarted, record(t, e, key).State)
	}

	interrupted("big-response")
	err := e.Resolve("big-response", make([]byte, 11), nil)
	require.ErrorIs(t, err, idem.ErrResponseTooLarge)
	rec := record(t, e, "big-response")
	require.Equal(t, idem.StateStarted, rec.State, "nothing stored: still an interrupted execution")
	require.Nil(t, rec.Response)

	interrupted("big-error")
	err = e.Resolve("big-error", []byte("12345"), &idem.Error{Code: "code", Message: "msg"})
	require.ErrorIs(t, err, idem.ErrResponseTooLarge, "the code and message count too")
	require.Equal(t, idem.StateStarted, record(t, e, "big-error").State)

	// At the limit it is stored, and replayed.
	require.NoError(t, e.Resolve("big-response", make([]byte, 10), nil))
	res, err := e.Do(bg, "big-response", nil, mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Len(t, res.Response, 10)
	require.NoError(t, e.Resolve("big-error", []byte("1234"), &idem.Error{Code: "co", Message: "msg"}))
}

func TestResolveWithoutLimitStoresAnySize(t *testing.T) {
	e, _ := boltkit.Open(t, &idem.Options{MaxResponseSize: -1})
	require.Panics(t, func() {
		_, _ = e.Do(bg, "k", nil, func(context.Context) ([]byte, error) { panic("crash") })
	})
	require.NoError(t, e.Resolve("k", make([]byte, 2<<20), nil))
	require.Len(t, record(t, e, "k").Response, 2<<20)
}
