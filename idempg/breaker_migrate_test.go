package idempg

import (
	"context"
	"testing"
	"time"
)

// TestBreakerMigrateOnHookedPoolBesideAnotherMigrate: Migrate is documented
// as safe to run from several processes at once, and the README's hooked
// pool (AfterConnect) is the pool Migrate and Open take. Here another
// process's Migrate is mid-way through version 7 (its transaction has
// recorded the version and dropped the constraints, not committed yet) and
// stays so for longer than the hook's LockTimeout; this process's Migrate
// on a hooked pool must wait for it and then find version 7 applied, as it
// does on a plain pool, not fail with the session's lock_timeout (55P03).
//
// The plain subtest is the control: the same scenario on a pool without
// the hook passes.
func TestBreakerMigrateOnHookedPoolBesideAnotherMigrate(t *testing.T) {
	for _, hook := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "hooked"}[hook], func(t *testing.T) { breakerMigrateBeside(t, hook) })
	}
}

func breakerMigrateBeside(t *testing.T, hook bool) {
	ctx := context.Background()
	pool, s, _ := schemaAt(t, 6)
	const lock = 100 * time.Millisecond
	hooked := pool
	if hook {
		hooked = hookedPool(t, &Options{Schema: s.Schema, LockTimeout: lock})
	}

	var v7 migration
	for _, m := range migrations {
		if m.version == 7 {
			v7 = m
		}
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, s.sql(`INSERT INTO {schema}.idem_migrations (version, name) VALUES ($1::integer, $2::text)`), v7.version, v7.name); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, s.sql(v7.sql)); err != nil {
		t.Fatal(err)
	}

	type result struct {
		did []int
		err error
	}
	done := make(chan result, 1)
	go func() {
		did, err := Migrate(ctx, hooked, &Options{Schema: s.Schema, LockTimeout: lock})
		done <- result{did, err}
	}()
	// The other process commits once this one's Migrate has waited for it
	// (by the server's account) three times the hook's LockTimeout, or
	// once this one's Migrate has returned.
	var res result
	committed := false
	for {
		select {
		case res = <-done:
		default:
			var waited bool
			if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid <> pg_backend_pid()
				AND wait_event_type = 'Lock' AND query LIKE '%' || $1::text || '%idem_migrations%'
				AND now() - query_start > $2::interval)`, s.Schema, (3 * lock).String()).Scan(&waited); err != nil {
				t.Fatal(err)
			}
			if waited && !committed {
				if err := holder.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				committed = true
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		break
	}
	if !committed {
		t.Errorf("Migrate returned before the other process's migration committed: %v, %v", res.did, res.err)
	}
	if res.err != nil {
		t.Errorf("Migrate on a hooked pool while another process's Migrate of version 7 was running: %v; want it to wait and find the version applied", res.err)
	}
}
