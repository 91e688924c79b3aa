package idemmcp_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemmcp"
)

func TestRefusalErrorRoundTrips(t *testing.T) {
	for typ, code := range map[string]int64{
		idemmcp.TypeKeyRequired: idemmcp.CodeKeyRequired, idemmcp.TypeKeyInvalid: idemmcp.CodeKeyInvalid,
		idemmcp.TypeConflict: idemmcp.CodeConflict, idemmcp.TypeInProgress: idemmcp.CodeInProgress,
		idemmcp.TypeIncomplete: idemmcp.CodeIncomplete, idemmcp.TypeUnavailable: idemmcp.CodeUnavailable,
	} {
		we := idemmcp.RefusalError(typ, 100*time.Millisecond, "why")
		require.EqualValues(t, code, we.Code)
		require.Equal(t, "idempotency: why", we.Message)
		ref, ok := idemmcp.RefusalOf(fmt.Errorf("calling: %w", we))
		require.True(t, ok)
		require.Equal(t, idemmcp.Refusal{Type: typ, RetryAfter: 1, Code: code}, *ref)
	}
	_, ok := idemmcp.RefusalOf(&jsonrpc.Error{Code: -32001, Message: "x", Data: json.RawMessage(`{"type":"other"}`)})
	require.False(t, ok)
	_, ok = idemmcp.RefusalOf(errors.New("plain"))
	require.False(t, ok)
}

// TestRefusalForFollowsTheCore: each kind of idemcore's mapping is sent
// with its code (the Code* constants are idemcore's table) and type.
func TestRefusalForFollowsTheCore(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int64
		typ  string
		wait int
	}{
		{fmt.Errorf("%w: empty", idemcore.ErrInvalidKey), idemmcp.CodeKeyInvalid, idemmcp.TypeKeyInvalid, 0},
		{idemcore.ErrFingerprintMismatch, idemmcp.CodeConflict, idemmcp.TypeConflict, 0},
		{&idemcore.InProgressError{RetryAfter: 3 * time.Second}, idemmcp.CodeInProgress, idemmcp.TypeInProgress, 3},
		{idemcore.Retryable(errors.New("gone")), idemmcp.CodeInProgress, idemmcp.TypeInProgress, 1},
		{idemcore.ErrIncomplete, idemmcp.CodeIncomplete, idemmcp.TypeIncomplete, 0},
		{idemcore.ErrClosed, idemmcp.CodeUnavailable, idemmcp.TypeUnavailable, 1},
	} {
		ref, ok := idemcore.RefusalOf(&idemcore.OpError{Op: "do", Key: "k", Err: c.err})
		require.True(t, ok, c.err)
		we := idemmcp.RefusalFor(ref, time.Second, c.err)
		require.Equal(t, c.code, we.Code, c.err)
		got, ok := idemmcp.RefusalOf(we)
		require.True(t, ok, c.err)
		require.Equal(t, idemmcp.Refusal{Type: c.typ, RetryAfter: c.wait, Code: c.code}, *got, c.err)
	}
	require.EqualValues(t, idemmcp.CodeKeyRequired, idemcore.RefusalKeyMissing.Refusal().Code)

	ref, ok := idemcore.RefusalOf(fmt.Errorf("%w: big", idemcore.ErrResponseTooLarge))
	require.True(t, ok)
	we := idemmcp.RefusalFor(ref, time.Second, nil)
	require.EqualValues(t, jsonrpc.CodeInternalError, we.Code)
	require.Empty(t, we.Data)
}
