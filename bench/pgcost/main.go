// Command pgcost measures what the parts of idempg's two statements of a
// fresh key's Do (the claim and the completion) cost the server, beside the
// naive pattern's INSERT and UPDATE, on the server at IDEM_TEST_PG
// (../scripts/postgres.sh start prints it).
//
// Usage:
//
//	go run ./pgcost [-n 2500]
//
// Each of n rounds runs every variant once, in a random order, one claim
// and then the completion of the same key, each alone in its transaction
// (a WAL flush each, fsync on), on one connection at a time. The table gives
// each variant's p50 per statement and the sum's ratio to the naive pair's
// (lower is cheaper). The variants are copies of idempg's statements
// (claim.go and complete.go), on tables of their own in a schema the command
// makes and drops:
//
//   - naive: the bench's Postgres pattern (INSERT … ON CONFLICT, then
//     UPDATE), its SELECT left out.
//   - v6: idem_records with the four CHECK constraints it had until schema
//     version 7, lock_timeout set by each statement (limitCTE).
//   - v7: without the CHECK constraints, lock_timeout set by each statement
//     (a pool without idempg.AfterConnect, or PollOnly).
//   - v7-session: without both: lock_timeout from the session
//     (idempg.AfterConnect).
//   - hot, hot-ff70: v7-session on a table whose only indexes are the
//     primary key and one on started_ns + retention_ns (an expiry index
//     no completion changes), the second at fillfactor 70: what a
//     completion that updates no index (a HOT update) would save. No
//     schema version has these indexes: Close's takeover (the lease index)
//     and the pruner (the expiry index) need another way first.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempg"
)

// nowNs is idempg's stamp of the database's clock, Unix ns.
const nowNs = `((extract(epoch FROM statement_timestamp()) * 1000000)::bigint * 1000)`

// limitCTE is idempg's per-statement lock_timeout.
const limitCTE = `WITH idem_limit AS MATERIALIZED (SELECT set_config('lock_timeout', '5000', true) AS v) `

// claim is idempg's claim of a fresh key ({limit}: the CTE's join, if any).
const claim = `{with}INSERT INTO {t} AS r (key, fingerprint, state, attempt, fence, owner, lease_until,
		started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns)
	SELECT u.key, u.fp, 1, u.attempt, nextval('{schema}.idem_fence'), 'pgcost', now() + interval '30 seconds',
		{now_ns}, 0, u.ret, u.kept, CASE WHEN u.kept THEN 0 ELSE {now_ns} + u.ret END
	FROM (VALUES ($1::text, $2::bigint, 1, 86400000000000::bigint, false)) AS u(key, fp, attempt, ret, kept){join}{where}
	ORDER BY u.key
	ON CONFLICT (key) DO NOTHING
	RETURNING key, fence, (extract(epoch FROM lease_until - now()) * 1000000)::bigint, started_ns`

// complete is idempg's completion of a lone call.
const complete = `{with}UPDATE {t} SET state = 2, owner = NULL, lease_until = NULL,
	attempt = 1, completed_ns = {now_ns}, retention_ns = 86400000000000::bigint,
	kept_until_resolved = false, expires_ns = {now_ns} + 86400000000000::bigint, response = $3::bytea, has_error = false,
	error_code = ''::bytea, error_message = ''::bytea{from}{where} key = $1::text AND fence = $2::bigint AND state <> 2
	RETURNING started_ns, completed_ns, CASE WHEN waiters THEN pg_notify('idem_pgcost', key) END`

const (
	naiveClaim    = `INSERT INTO {schema}.naive AS r (key, fp, state, expires_at) VALUES ($1, $2, 0, $3) ON CONFLICT (key) DO UPDATE SET fp = excluded.fp, state = 0, response = NULL, expires_at = excluded.expires_at WHERE r.expires_at <= $4`
	naiveComplete = `UPDATE {schema}.naive SET state = 1, response = $1, expires_at = $2 WHERE key = $3`
)

// v6Checks are idem_records' CHECK constraints before version 7.
const v6Checks = `ALTER TABLE {schema}.v6 ADD CHECK (state IN (1, 2)), ADD CHECK (attempt >= 1),
	ADD CHECK (state = 2 OR (owner IS NOT NULL AND lease_until IS NOT NULL)),
	ADD CHECK (state = 1 OR (owner IS NULL AND lease_until IS NULL))`

type variant struct {
	name            string
	claim, complete string // empty: the naive pair
}

func main() {
	n := flag.Int("n", 2500, "rounds")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "pgcost:", err)
		os.Exit(1)
	}
}

func run(n int) error {
	ctx := context.Background()
	dsn := os.Getenv("IDEM_TEST_PG")
	if dsn == "" {
		return fmt.Errorf("IDEM_TEST_PG not set (../scripts/postgres.sh start)")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	var sfx [6]byte
	_, _ = rand.Read(sfx[:])
	schema := "idem_pgcost_" + hex.EncodeToString(sfx[:])
	if _, err := idempg.Migrate(ctx, pool, &idempg.Options{Schema: schema}); err != nil {
		return err
	}
	defer pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
	sub := strings.NewReplacer("{schema}", schema)
	ddl := sub.Replace(`CREATE TABLE {schema}.naive (key text PRIMARY KEY, fp bytea NOT NULL, state smallint NOT NULL, response bytea, expires_at bigint NOT NULL);
CREATE INDEX ON {schema}.naive (expires_at);
CREATE TABLE {schema}.v6 (LIKE {schema}.idem_records INCLUDING ALL);
CREATE TABLE {schema}.v7 (LIKE {schema}.idem_records INCLUDING ALL);
CREATE TABLE {schema}.v7session (LIKE {schema}.idem_records INCLUDING ALL);
CREATE TABLE {schema}.hot (LIKE {schema}.idem_records INCLUDING DEFAULTS, PRIMARY KEY (key));
CREATE INDEX ON {schema}.hot ((started_ns + retention_ns));
CREATE TABLE {schema}.hotff (LIKE {schema}.idem_records INCLUDING DEFAULTS, PRIMARY KEY (key)) WITH (fillfactor = 70);
CREATE INDEX ON {schema}.hotff ((started_ns + retention_ns));
` + v6Checks)
	if _, err := pool.Exec(ctx, ddl); err != nil {
		return err
	}
	withLimit := strings.NewReplacer("{with}", limitCTE, "{join}", ", idem_limit", "{where}", " WHERE idem_limit.v IS NOT NULL", "{from}", " FROM idem_limit")
	withLimitDone := strings.NewReplacer("{with}", limitCTE, "{from}", " FROM idem_limit", "{where}", " WHERE idem_limit.v IS NOT NULL AND")
	session := strings.NewReplacer("{with}", "", "{join}", "", "{where}", "", "{from}", "")
	sessionDone := strings.NewReplacer("{with}", "", "{from}", "", "{where}", " WHERE")
	table := func(t, q string) string {
		return strings.NewReplacer("{t}", schema+"."+t, "{now_ns}", nowNs, "{schema}", schema).Replace(q)
	}
	vs := []variant{
		{name: "naive"},
		{"v6", table("v6", withLimit.Replace(claim)), table("v6", withLimitDone.Replace(complete))},
		{"v7", table("v7", withLimit.Replace(claim)), table("v7", withLimitDone.Replace(complete))},
		{"v7-session", table("v7session", session.Replace(claim)), table("v7session", sessionDone.Replace(complete))},
		{"hot", table("hot", session.Replace(claim)), table("hot", sessionDone.Replace(complete))},
		{"hot-ff70", table("hotff", session.Replace(claim)), table("hotff", sessionDone.Replace(complete))},
	}
	claims, completes := make([][]time.Duration, len(vs)), make([][]time.Duration, len(vs))
	resp, fp := make([]byte, 200), make([]byte, 32)
	exec := func(q string, args ...any) error {
		rows, err := pool.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	for i := range n {
		for _, j := range perm(len(vs)) {
			v := vs[j]
			key := fmt.Sprintf("key-%d-%d", j, i)
			t0 := time.Now()
			if v.claim == "" {
				now := time.Now().UnixNano()
				if err := exec(sub.Replace(naiveClaim), key, fp, now+int64(24*time.Hour), now); err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
				t1 := time.Now()
				if err := exec(sub.Replace(naiveComplete), resp, now+int64(24*time.Hour), key); err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
				claims[j], completes[j] = append(claims[j], t1.Sub(t0)), append(completes[j], time.Since(t1))
				continue
			}
			var fence int64
			if err := pool.QueryRow(ctx, v.claim, key, int64(i)).Scan(nil, &fence, nil, nil); err != nil {
				return fmt.Errorf("%s: claim: %w", v.name, err)
			}
			t1 := time.Now()
			if err := exec(v.complete, key, fence, resp); err != nil {
				return fmt.Errorf("%s: completion: %w", v.name, err)
			}
			claims[j], completes[j] = append(claims[j], t1.Sub(t0)), append(completes[j], time.Since(t1))
		}
	}
	var load string
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	fmt.Printf("`go run ./pgcost -n %d` · %s UTC · load average %s\n\n", n, time.Now().UTC().Format("2006-01-02 15:04"), load)
	fmt.Println("| variant | claim p50 | completion p50 | both | ÷ naive |")
	fmt.Println("|---|--:|--:|--:|--:|")
	base := p50(claims[0]) + p50(completes[0])
	for j, v := range vs {
		c, d := p50(claims[j]), p50(completes[j])
		fmt.Printf("| %s | %v | %v | %v | %.2f |\n", v.name, c.Round(time.Microsecond), d.Round(time.Microsecond), (c + d).Round(time.Microsecond), float64(c+d)/float64(base))
	}
	// The server's count of HOT updates (no index touched) per table, once
	// the connections' statistics have reached it.
	time.Sleep(1500 * time.Millisecond)
	rows, err := pool.Query(ctx, `SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND n_tup_upd > 0 ORDER BY relname`, schema)
	if err != nil {
		return err
	}
	fmt.Print("\nHOT updates (of all updates):")
	for rows.Next() {
		var t string
		var upd, hot int64
		if err := rows.Scan(&t, &upd, &hot); err != nil {
			return err
		}
		fmt.Printf(" %s %d/%d;", t, hot, upd)
	}
	fmt.Println()
	return rows.Err()
}

// perm is a random order of 0..n-1.
func perm(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	for i := n - 1; i > 0; i-- {
		j, _ := rand.Int(rand.Reader, big.NewInt(int64(i+1)))
		p[i], p[j.Int64()] = p[j.Int64()], p[i]
	}
	return p
}

func p50(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}
