package idempg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestClaimAnswersTheRowFound: a claim of a key with a live record is not
// made, and its statement answers the record stored (done, or started by
// another owner), so that the engine decides again without a Lookup of its
// own; lone and batched claims alike, beside a free key that is claimed.
func TestClaimAnswersTheRowFound(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) { testClaimAnswersTheRowFound(t, env) })
	}
}

func testClaimAnswersTheRowFound(t *testing.T, env string) {
	ctx := context.Background()
	b, pool := testBackend(t, env)
	if _, err := pool.Exec(ctx, b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, expires_ns, response, has_error, error_code, error_message) VALUES
		('done', 7, 2, 3, nextval('{schema}.idem_fence'), NULL, NULL, {now_ns} - 5000, {now_ns}, 3600000000000, {now_ns} + 3600000000000, 'resp', true, 'c', 'm'),
		('held', 8, 1, 2, nextval('{schema}.idem_fence'), 'other', now() + interval '1 hour', {now_ns}, 0, 3600000000000, {now_ns} + 3600000000000, NULL, false, '', '')`),
		b.s.args()...); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, reqs []*claimReq) {
		t.Helper()
		byKey := map[string]*claimReq{}
		for _, r := range reqs {
			byKey[r.st.Key] = r
		}
		if r := byKey["free1"]; r.err != nil || r.fence == 0 {
			t.Errorf("claim of a free key: %v (fence %d)", r.err, r.fence)
		}
		d := byKey["done"]
		if !errors.Is(d.err, pgx.ErrNoRows) || d.found == nil || d.found.err != nil {
			t.Fatalf("claim of a done key: %v, found %+v; want not claimed, the record found", d.err, d.found)
		}
		if rec := d.found.rec; rec.Key != "done" || rec.State != idemcore.StateDone || rec.Fingerprint != 7 || rec.Attempt != 3 ||
			string(rec.Response) != "resp" || rec.Err == nil || rec.Err.Code != "c" || rec.Err.Message != "m" ||
			rec.Retention != time.Hour || rec.CompletedAt.Sub(rec.StartedAt) != 5*time.Microsecond || d.found.at.IsZero() {
			t.Errorf("the done record found: %+v (err %+v) at %v", rec, rec.Err, d.found.at)
		}
		h := byKey["held"]
		if !errors.Is(h.err, pgx.ErrNoRows) || h.found == nil || h.found.rec.State != idemcore.StateStarted || h.found.rec.Attempt != 2 {
			t.Errorf("claim of a key another owner holds: %v, found %+v; want not claimed, the started record found", h.err, h.found)
		}
	}
	claim := func(keys ...string) []*claimReq {
		var reqs []*claimReq
		for _, k := range keys {
			reqs = append(reqs, &claimReq{st: &idemcore.Record{Key: k, State: idemcore.StateStarted, Fingerprint: 9, Attempt: 1,
				Retention: time.Hour}, done: make(chan struct{})})
		}
		b.claimBatch(reqs)
		return reqs
	}
	for key, want := range map[string]idemcore.State{"done": idemcore.StateDone, "held": idemcore.StateStarted} {
		// A lone claim is not made either: no token (a claim of token 0
		// would complete nothing), the row found.
		r := claim(key)[0]
		if !errors.Is(r.err, pgx.ErrNoRows) || r.fence != 0 || r.found == nil || r.found.rec.State != want {
			t.Errorf("a lone claim of key %s: %v (fence %d), found %+v; want not claimed, the record found", key, r.err, r.fence, r.found)
		}
	}
	check(t, claim("done", "held", "free1"))

	// The claims that found live rows wrote nothing and locked nothing: a
	// row lock (ON CONFLICT DO UPDATE locks the row it meets, even when
	// its WHERE refuses) would leave its transaction's id in xmax, and make
	// every replay read through a claim a write (Info.ClaimFirst).
	var locked int
	if err := pool.QueryRow(ctx, b.sql(`SELECT count(*) FROM {schema}.idem_records WHERE key IN ('done', 'held') AND xmax <> '0'::xid`),
		b.s.args()...).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if locked != 0 {
		t.Errorf("%d of the rows found were locked by the claims that read them; want none", locked)
	}
}
