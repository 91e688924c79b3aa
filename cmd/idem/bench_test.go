package main

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/kit/benchkit"
)

// benchOnly selects three cheap rows: one caller's first executions, on every
// contender.
const benchOnly = "^first/callers=1/"

func TestBenchTable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := idemCmd(t, nil, "", "bench", "--quick", "--only", benchOnly, "--dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)

	require.Contains(t, r.stdout, "`idem bench --dir "+shellQuote(dir)+" --quick --only '"+benchOnly+"'` · ")
	require.Contains(t, r.stdout, "- sizes: quick")
	require.Contains(t, r.stdout, "| workload | contender | ops/s | p50 | p99 | ratio | notes |\n")
	number, latency := `[0-9][0-9,]*`, `[0-9.]+(ns|µs|ms|s)`
	rowRE := func(contender, ratio string) string {
		return `(?m)^\| first/callers=1 \| ` + contender + ` \| ` + number + ` \| ` + latency + ` \| ` + latency + ` \| ` + ratio + ` \| [0-9]+ ops in `
	}
	require.Regexp(t, rowRE("idem", `1 \(ref\)`), r.stdout)
	require.Regexp(t, rowRE("naive-bbolt", `[0-9.]+×`), r.stdout)
	require.Regexp(t, rowRE("bare", `[0-9.]+×`), r.stdout)
	require.NotContains(t, r.stdout, "sqlite", "no row needs a database driver")
	require.Equal(t, 3, len(regexp.MustCompile(`(?m)^\| first/`).FindAllString(r.stdout, -1)), r.stdout)

	// Not a terminal: a line per row instead of a bar.
	require.Contains(t, r.stderr, "[1/3] first/callers=1 idem: ")
	require.Contains(t, r.stderr, "[3/3] first/callers=1 naive-bbolt: ")
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, left, "the stores are removed")
}

func TestBenchJSON(t *testing.T) {
	t.Parallel()
	r := idemCmd(t, nil, "", "--json", "bench", "--quick", "--only", benchOnly+"(idem|naive-bbolt)$", "--dir", t.TempDir())
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	var rows []benchkit.Row
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows), r.stdout)
	require.Len(t, rows, 2)
	for i, want := range []string{"idem", "naive-bbolt"} {
		row := rows[i]
		require.Equal(t, "first/callers=1", row.Workload)
		require.Equal(t, want, row.Contender)
		require.Empty(t, row.Error)
		require.Positive(t, row.OpsPerSec)
		require.Positive(t, row.P99us)
		require.Equal(t, "idem", row.RatioTo)
	}
	require.InDelta(t, 1, rows[0].Ratio, 1e-9)
}

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		wantStderr string
	}{
		{"bad regular expression", []string{"--only", "("}, "idem: --only: error parsing regexp: missing closing ): `(`\n"},
		{"no row matches", []string{"--only", "^sqlite"}, "idem: --only \"^sqlite\" matches no workload/contender\n"},
		{"extra argument", []string{"now"}, "idem: bench: unknown command \"now\" for \"idem bench\" (usage: idem bench [flags])\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			r := idemCmd(t, nil, "", append([]string{"bench", "--quick", "--dir", dir}, tt.args...)...)
			require.Equal(t, 2, r.code)
			require.Equal(t, tt.wantStderr+"Run 'idem --help' for usage.\n", r.stderr)
			require.Empty(t, r.stdout)
			left, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Empty(t, left)
		})
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/tmp/x":        "/tmp/x",
		"^first/":       "'^first/'",
		"":              "''",
		"it's":          `'it'\''s'`,
		"replay/keys=1": "replay/keys=1",
	} {
		require.Equal(t, want, shellQuote(in), "shellQuote(%q)", in)
	}
}
