package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// A nil fn is bad input: Do and DoTx refuse it with an error before they
// store anything, instead of committing a started record and then panicking
// on the nil call (which left an "interrupted execution" of a fn that never
// existed, recovered by the next call as if it might have had its effect).

func TestNilFnIsRefusedAndStoresNothing(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	var res idem.Result
	var err error
	require.NotPanics(t, func() { res, err = e.Do(bg, "nil-do", nil, nil) })
	require.Error(t, err)
	require.Contains(t, err.Error(), "nil fn")
	require.Zero(t, res.Attempt)
	_, gerr := e.Get("nil-do")
	require.ErrorIs(t, gerr, idem.ErrNotFound, "nothing stored for a nil fn")

	require.NotPanics(t, func() { _, err = e.DoTx(bg, "nil-dotx", nil, nil) })
	require.Error(t, err)
	require.Contains(t, err.Error(), "nil fn")
	_, gerr = e.Get("nil-dotx")
	require.ErrorIs(t, gerr, idem.ErrNotFound, "nothing stored for a nil fn")

	var v int
	require.NotPanics(t, func() { v, res, err = idem.DoJSON[int](bg, e, "nil-json", 1, nil) })
	require.Error(t, err)
	require.Contains(t, err.Error(), "nil fn")
	require.Zero(t, v)
	_, gerr = e.Get("nil-json")
	require.ErrorIs(t, gerr, idem.ErrNotFound, "nothing stored for a nil fn")

	// The key is still new: the next call runs fn as attempt 1, not as the
	// recovery of an interrupted execution.
	var call idem.Call
	res, err = e.Do(bg, "nil-do", nil, func(ctx context.Context) ([]byte, error) {
		call, _ = idem.CallFrom(ctx)
		return []byte("v"), nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, res.Attempt)
	require.False(t, call.Recovered)
	started := 0
	require.NoError(t, e.Records(func(r *idem.Record, err error) error {
		if err == nil && r.State == idem.StateStarted {
			started++
		}
		return err
	}))
	require.Zero(t, started)
}
