package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idempg"
)

// testPG returns the DSN in env (IDEM_TEST_PG, or IDEM_TEST_PGBOUNCER), and a
// schema name of the test's own, dropped when it ends. Without the variable
// the test is skipped, or fails under CI.
func testPG(t *testing.T, env string) (dsn, schema string) {
	t.Helper()
	dsn = os.Getenv(env)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %s is not: start the server with scripts/postgres.sh start --pgbouncer", env)
		}
		t.Skipf("%s not set: eval \"$(scripts/postgres.sh start --pgbouncer)\" runs a local server", env)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema = "idem_cli_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), os.Getenv("IDEM_TEST_PG"))
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	return dsn, schema
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"IDEM_TEST_PG", "IDEM_TEST_PGBOUNCER"} {
		t.Run(env, func(t *testing.T) {
			dsn, schema := testPG(t, env)
			args := []string{"migrate", "--pg", dsn, "--schema", schema}
			if env == "IDEM_TEST_PGBOUNCER" {
				args = append(args, "--poll-only")
			}
			r := idemCmd(t, nil, "", append(args, "--json")...)
			require.Equal(t, 0, r.code, r.stderr)
			doc := decode[migrateJSON](t, r.stdout)
			require.Equal(t, schema, doc.Schema)
			require.Equal(t, idempg.SchemaVersion, doc.Version)
			require.NotEmpty(t, doc.Applied, "a new schema gets every version")
			require.Equal(t, idempg.SchemaVersion, doc.Applied[len(doc.Applied)-1], "a new schema gets every version")

			// Again: nothing to do. $IDEM_PG stands in for --pg.
			r = idemCmd(t, map[string]string{"IDEM_PG": dsn}, "", append([]string{"migrate"}, args[3:]...)...)
			require.Equal(t, 0, r.code, r.stderr)
			require.Equal(t, "schema "+schema+" is up to date (version "+strconv.Itoa(idempg.SchemaVersion)+")\n", r.stdout)
		})
	}
}

func TestMigrateUsage(t *testing.T) {
	t.Parallel()
	r := idemCmd(t, nil, "", "migrate")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "migrate needs --pg DSN")

	r = idemCmd(t, nil, "", "migrate", "--pg", "postgres://u:secret@127.0.0.1:1/x?sslmode=disable", "--schema", "Bad-Name")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "invalid options")
	require.True(t, strings.HasPrefix(r.stderr, "idem: migrate: "), "one prefix: %s", r.stderr)
	require.NotContains(t, r.stderr, "secret")

	r = idemCmd(t, nil, "", "migrate", "--pg", "postgres://u:secret@[::1:bad/x")
	require.Equal(t, 1, r.code)
	require.NotContains(t, r.stderr, "secret", "a DSN's password never reaches the error line")
}

// TestMigrateEmptySchema: --schema "" given explicitly is a usage error
// (exit 2, nothing migrated), not the default schema: a script whose
// variable came out empty must not migrate public.
func TestMigrateEmptySchema(t *testing.T) {
	t.Parallel()
	r := idemCmd(t, nil, "", "migrate", "--pg", "postgres://nobody@127.0.0.1:1/none", "--schema", "")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "--schema")
}
