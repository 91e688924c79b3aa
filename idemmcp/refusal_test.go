package idemmcp_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

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
