package idemhttp_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// A resolution over the engine's Options.MaxResponseSize is the operator's
// bad input, refused by the engine with ErrResponseTooLarge: the handler
// answers 413 too_large, as for a body over MaxBody, not 500, and the record
// stays an interrupted execution.
func TestAdminResolveOverEngineLimitIs413(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{MaxResponseSize: 16})
	base := adminServer(t, e, &idemhttp.AdminOptions{Authorize: idemhttp.AllowBearer(adminToken), MaxBody: 1 << 20})
	adminInterrupt(t, e, "order-1")
	r := adminCall(t, http.MethodPost, adminKeyURL(base, "/records/resolve", "order-1"), adminToken, map[string]any{"response": strings.Repeat("x", 17)})
	adminProblemOf(t, r, http.StatusRequestEntityTooLarge, "too_large")
	rec, err := e.Get("order-1")
	require.NoError(t, err)
	require.Equal(t, idem.StateStarted, rec.State)
}
