package idem_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestKeyOfDifferentPartsGiveDifferentKeys(t *testing.T) {
	long := strings.Repeat("x", 10_000)
	for _, tc := range []struct {
		name string
		a, b []string
	}{
		{"separator inside a part", []string{"order", "a|b", "c"}, []string{"order", "a", "b|c"}},
		{"boundary moved", []string{"order", "ab", "c"}, []string{"order", "a", "bc"}},
		{"empty part added", []string{"order", "a"}, []string{"order", "a", ""}},
		{"empty parts counted", []string{"order", "", ""}, []string{"order", ""}},
		{"no parts vs one empty part", []string{"order"}, []string{"order", ""}},
		{"empty part moved", []string{"order", "", "a"}, []string{"order", "a", ""}},
		{"length prefix lookalike", []string{"order", "\x01a"}, []string{"order", "a"}},
		{"order of parts", []string{"order", "a", "b"}, []string{"order", "b", "a"}},
		{"namespace", []string{"order", "a"}, []string{"refund", "a"}},
		{"namespace boundary", []string{"order", "a"}, []string{"ordera"}},
		{"long parts differing at the end", []string{"order", long + "1"}, []string{"order", long + "2"}},
		{"long part split", []string{"order", long, long}, []string{"order", long + long}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ka, kb := idem.KeyOf(tc.a...), idem.KeyOf(tc.b...)
			require.NotEqual(t, ka, kb)
			require.Equal(t, ka, idem.KeyOf(tc.a...), "deterministic")
		})
	}
}

func TestKeyOfShape(t *testing.T) {
	k := idem.KeyOf("create_order", "customer-8812", "SKU-1", "2025-01-02")
	ns, sum, ok := strings.Cut(k, ":")
	require.True(t, ok)
	require.Equal(t, "create_order", ns, "the namespace is readable")
	require.Regexp(t, "^[0-9a-f]{64}$", sum)
	require.NotContains(t, k, "customer-8812", "no personal data in clear")

	for _, parts := range [][]string{{"n"}, {"n", ""}, {"n", strings.Repeat("p", 1<<20)}, {strings.Repeat("n", idem.MaxNamespaceLen), "a", "b"}} {
		k := idem.KeyOf(parts...)
		require.Len(t, k, len(parts[0])+65, "fixed length")
		require.LessOrEqual(t, len(k), idem.MaxKeyLen, "always a valid key")
	}
}

func TestKeyOfPanicsOnABadNamespace(t *testing.T) {
	for name, parts := range map[string][]string{
		"no parts":            nil,
		"empty namespace":     {"", "a"},
		"namespace too long":  {strings.Repeat("n", idem.MaxNamespaceLen+1), "a"},
		"namespace not UTF-8": {"\xff", "a"},
		"leading white space": {" create_order", "a"},
		"a control character": {"create\x00order", "a"},
		"a byte-order mark":   {"\ufeffcreate_order", "a"},
	} {
		t.Run(name, func(t *testing.T) {
			require.Panics(t, func() { idem.KeyOf(parts...) })
		})
	}
}
