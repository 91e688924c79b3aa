package idemmcp_test

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmcp"
)

func fp(t *testing.T, tool, args string) string {
	t.Helper()
	b, err := idemmcp.Fingerprint(&mcp.CallToolParamsRaw{Name: tool, Arguments: json.RawMessage(args)})
	require.NoError(t, err)
	return string(b)
}

func TestFingerprintCanonicalises(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b string
	}{
		{"key order", `{"a":1,"b":{"c":2,"d":3}}`, `{"b":{"d":3,"c":2},"a":1}`},
		{"space", `{"a": [1, 2]}`, `{"a":[1,2]}`},
		{"1 and 1.0", `{"n":1}`, `{"n":1.0}`},
		{"exponents", `{"n":100}`, `{"n":1e2}`},
		{"fractions", `{"n":1.5}`, `{"n":15e-1}`},
		{"zeros", `{"n":0}`, `{"n":-0.000}`},
		{"missing arguments", ``, `{}`},
		{"null arguments", `null`, `{}`},
		{"escapes", `{"s":"\u00e9"}`, `{"s":"é"}`},
		{"repeated key keeps the last", `{"a":1,"a":2}`, `{"a":2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, fp(t, "x", tc.a), fp(t, "x", tc.b))
		})
	}
	for _, tc := range []struct {
		name string
		a, b string
	}{
		{"large integers", `{"n":9007199254740993}`, `{"n":9007199254740992}`},
		{"number and string", `{"n":1}`, `{"n":"1"}`},
		{"arrays keep order", `{"a":[1,2]}`, `{"a":[2,1]}`},
		{"null and missing", `{"a":null}`, `{}`},
		{"tiny differences", `{"n":1.0000000000000000001}`, `{"n":1}`},
		{"huge exponents", `{"n":1e400}`, `{"n":1e401}`},
	} {
		t.Run(tc.name+" differ", func(t *testing.T) {
			require.NotEqual(t, fp(t, "x", tc.a), fp(t, "x", tc.b))
		})
	}
	require.NotEqual(t, fp(t, "create_order", `{}`), fp(t, "create_quote", `{}`), "the tool is part of it")

	withState, err := idemmcp.Fingerprint(&mcp.CallToolParamsRaw{Name: "x", Arguments: json.RawMessage(`{}`), RequestState: "s1"})
	require.NoError(t, err)
	require.NotEqual(t, fp(t, "x", `{}`), string(withState), "a continuation's state is part of it")

	for _, bad := range []string{`[1]`, `"s"`, `{"a":`, `{} {}`} {
		_, err := idemmcp.Fingerprint(&mcp.CallToolParamsRaw{Name: "x", Arguments: json.RawMessage(bad)})
		require.ErrorIs(t, err, idemmcp.ErrInvalidArguments, bad)
	}
}

func TestFingerprintIgnoresMeta(t *testing.T) {
	a, err := idemmcp.Fingerprint(&mcp.CallToolParamsRaw{Name: "x", Arguments: json.RawMessage(`{"a":1}`),
		Meta: mcp.Meta{idemmcp.MetaKey: "k1", "io.modelcontextprotocol/clientInfo": map[string]any{"name": "a"}}})
	require.NoError(t, err)
	b, err := idemmcp.Fingerprint(&mcp.CallToolParamsRaw{Name: "x", Arguments: json.RawMessage(`{"a":1}`)})
	require.NoError(t, err)
	require.Equal(t, string(a), string(b))
}

func FuzzFingerprint(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1.50e3}`, `{"b":[true,null,"x",{"c":-0}]}`, `{"n":123456789012345678901234567890}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, args string) {
		first, err := idemmcp.Fingerprint(&mcp.CallToolParamsRaw{Name: "x", Arguments: json.RawMessage(args)})
		if err != nil {
			return
		}
		// The canonical form is JSON, and its own canonical form.
		again, err := idemmcp.Fingerprint(&mcp.CallToolParamsRaw{Name: "x", Arguments: canonicalArgs(t, first)})
		require.NoError(t, err)
		require.Equal(t, string(first), string(again))
	})
}

func canonicalArgs(t *testing.T, fingerprint []byte) json.RawMessage {
	var v struct {
		Arguments json.RawMessage `json:"arguments"`
	}
	require.NoError(t, json.Unmarshal(fingerprint, &v))
	return v.Arguments
}
