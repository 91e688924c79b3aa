package mcpproxy

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmcp"
)

func TestCanonical(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"keys sorted at every depth", `{"b":1,"a":{"d":[true,null],"c":"x"}}`, `{"a":{"c":"x","d":[true,null]},"b":1e0}`},
		{"no insignificant space", " { \"a\" : [ 1 , 2 ] } ", `{"a":[1e0,2e0]}`},
		{"integer", `120`, `12e1`},
		{"decimal", `-1.50`, `-15e-1`},
		{"exponent", `0.1E+1`, `1e0`},
		{"zero of any form", `-0.000e5`, `0`},
		{"large integers stay exact", `9007199254740993`, `9007199254740993e0`},
		{"huge exponent", `1e999999999999999999999`, `1e999999999999999999999`},
		{"strings re-encoded as json.Marshal does", `"\u0041<&>\/"`, `"A\u003c\u0026\u003e/"`},
		{"duplicate key keeps the last", `{"a":1,"a":2}`, `{"a":2e0}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Canonical([]byte(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
		})
	}
}

func TestCanonicalEqualities(t *testing.T) {
	same := [][2]string{
		{`1`, `1.0`},
		{`1`, `10e-1`},
		{`{"a":1,"b":[2]}`, `{"b":[2.00],"a":1e0}`},
		{`100`, `1e2`},
	}
	for _, p := range same {
		a, err := Canonical([]byte(p[0]))
		require.NoError(t, err)
		b, err := Canonical([]byte(p[1]))
		require.NoError(t, err)
		require.Equal(t, string(a), string(b), "%s and %s", p[0], p[1])
	}
	differ := [][2]string{
		{`9007199254740993`, `9007199254740992`},
		{`1`, `"1"`},
		{`[1,2]`, `[2,1]`},
		{`{}`, `null`},
		{`0.1`, `0.10000000000000001`},
	}
	for _, p := range differ {
		a, err := Canonical([]byte(p[0]))
		require.NoError(t, err)
		b, err := Canonical([]byte(p[1]))
		require.NoError(t, err)
		require.NotEqual(t, string(a), string(b), "%s and %s", p[0], p[1])
	}
}

func TestCanonicalRefusesWhatIsNotOneValue(t *testing.T) {
	for _, in := range []string{``, `{`, `{} {}`, `1 x`, `{"a":}`} {
		_, err := Canonical([]byte(in))
		require.Error(t, err, "%q", in)
	}
}

// TestCanonicalIsIdemmcps pins Canonical to the form idemmcp writes each
// value in, so that a natural key from the proxy is the middleware's.
func TestCanonicalIsIdemmcps(t *testing.T) {
	for _, v := range []string{`1`, `1.0`, `-0.50e3`, `9007199254740993`, `"<a&b>"`, `{"z":[1,{"y":null,"x":true}],"a":"é"}`, `[]`, `null`} {
		fp, err := idemmcp.Fingerprint(&mcp.CallToolParamsRaw{Name: "t", Arguments: json.RawMessage(`{"a":` + v + `}`)})
		require.NoError(t, err)
		c, err := Canonical([]byte(v))
		require.NoError(t, err)
		require.Equal(t, `{"arguments":{"a":`+string(c)+`},"tool":"t"}`, string(fp), "%s", v)
	}
}
