package idempg

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestKeyedWritesUseThePrimaryKey: the writes by key and fencing token
// (completion, renewal, release) find their row by the primary key, also
// when the table's statistics, taken before a burst of claims, show no
// started row: a condition state = 1 let the planner prefer the partial
// lease index (WHERE state = 1), which it believed empty, and filter its
// entries by key, every entry a claim left since the last vacuum (58
// buffers per DoTx completion in the profile of issue 21, against 4).
func TestKeyedWritesUseThePrimaryKey(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.Env)
	s, err := resolve(&Options{Schema: pgtest.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, pool, &s.Options); err != nil {
		t.Fatal(err)
	}
	b := &backend{pool: pool, s: s}
	for _, q := range []string{
		`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, started_ns, completed_ns, retention_ns, expires_ns)
			SELECT 'd' || g, g, 2, 1, g, 1, 2, 1000, 1002 FROM generate_series(1, 20000) g`,
		`ANALYZE {schema}.idem_records`,
		`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until, started_ns, retention_ns, expires_ns)
			SELECT 's' || g, g, 1, 1, g, 'o', now() + interval '1 hour', 1, 1000, 1001 FROM generate_series(1, 2000) g`,
	} {
		if _, err := pool.Exec(ctx, b.sql(q)); err != nil {
			t.Fatal(err)
		}
	}
	for name, q := range map[string]string{
		"complete": completeSQL,
		"renew":    `UPDATE {schema}.idem_records SET lease_until = now() WHERE ` + heldSQL,
		"release":  `DELETE FROM {schema}.idem_records WHERE ` + heldSQL,
	} {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var plan strings.Builder
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "PREPARE idem_plan AS "+b.sql(q)); err != nil {
			t.Fatal(name, err)
		}
		args := "'s7', 7"
		if name == "complete" {
			args += ", 1, 1000, ''::bytea, false, ''::bytea, ''::bytea"
		}
		rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE idem_plan("+args+")")
		if err != nil {
			t.Fatal(name, err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(name, err)
		}
		_, _ = conn.Exec(ctx, "DEALLOCATE idem_plan")
		_, _ = conn.Exec(ctx, "RESET plan_cache_mode")
		conn.Release()
		if !strings.Contains(plan.String(), "idem_records_pkey") {
			t.Errorf("%s: the plan does not use the primary key:\n%s", name, plan.String())
		}
	}
}
