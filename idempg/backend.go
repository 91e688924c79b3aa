package idempg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/goid"
)

// backend is the Postgres storage of one engine: idemcore.Backend over pgx, with
// fn's DoTx transaction a pgx.Tx.
type backend struct {
	pool     *pgxpool.Pool
	s        *settings
	owner    string
	ownsPool bool

	// observer, if set, gets an EventCommit for each statement or
	// transaction that committed records (Options.Observer; set by open
	// before the engine's first call).
	observer idemcore.Observer

	// offset is added to the database's clock in every statement that
	// reads it, and fake, if set, replaces that clock for the times of
	// records and messages ({now_ns}; leases keep now() and the offset):
	// the tests' ways to move the database clock (never set in production:
	// see export_test.go).
	offset func() time.Duration
	fake   func() time.Time

	commits chan struct{} // Committed's: capacity 1

	// inFn counts RunTx fns running; fnGoroutines holds their goroutine
	// ids, for Holding.
	inFn         atomic.Int32
	fnGoroutines sync.Map // uint64 → struct{}

	l *listener // LISTEN/NOTIFY; nil in PollOnly mode

	// commitAvg is the moving average of DoTx's COMMITs, ns (commitTime).
	commitAvg atomic.Int64

	// fixed holds the statements of Do, made once (statement.go): those
	// that carry their settings, and those for a connection whose session
	// has them (AfterConnect, which marks it with mark); nil while the
	// tests move the clock.
	fixed [2]*statements
	mark  string
	// begins are DoTx's BEGIN queries (beginSQL): for a connection without
	// the backend's session settings, and for one with them.
	begins [2]string

	// outboxClaims holds the outbox claims this engine's dispatcher holds, by
	// seq (uint64 → outboxClaim): the token that fences Failed (delivery.go).
	outboxClaims sync.Map

	// Concurrent calls share statements and transactions (batch.go): Do's
	// claims of free keys and its completions, and DoTx calls (tx.go).
	claims    batcher[*claimReq]
	completes batcher[*completeReq]
	dotx      batcher[*txReq]

	closeOnce sync.Once
}

var _ idemcore.Backend[pgx.Tx] = (*backend)(nil)

// newBackend returns the backend over pool with s; the schema must be at
// SchemaVersion.
func newBackend(ctx context.Context, pool *pgxpool.Pool, s *settings, ownsPool bool) (*backend, error) {
	if m := pool.Config().ConnConfig.DefaultQueryExecMode; s.PollOnly && m != pgx.QueryExecModeExec && m != pgx.QueryExecModeSimpleProtocol {
		return nil, fmt.Errorf("%w: PollOnly needs a pool whose DefaultQueryExecMode is QueryExecModeExec or QueryExecModeSimpleProtocol (no prepared statements), not %v", ErrOptions, m)
	}
	if err := checkVersion(ctx, pool, s); err != nil {
		return nil, err
	}
	b := &backend{pool: pool, s: s, owner: instanceOwner(s.Owner), ownsPool: ownsPool, offset: s.clockOffset, fake: s.clock,
		commits: make(chan struct{}, 1), mark: s.sessionMark()}
	b.begins = [2]string{b.beginSQL(false), b.beginSQL(true)}
	conns := int(pool.Config().MaxConns)
	stmts := max(2, conns/stmtBatchShare)
	// Do's statements take stmts slots of each kind; DoTx batches hold
	// theirs while fns run, so they take at most their share
	// (txBatchShare) and leave the rest to Do's statements and the lease
	// renewals.
	// Under a crowd (stmtCrowd times as many requests of a kind as slots),
	// crowdSlots.
	crowd := stmtCrowd * stmts
	b.claims = batcher[*claimReq]{run: b.claimBatch, max: stmts, limit: maxStmtBatch, crowd: crowd, min: crowdSlots}
	b.completes = batcher[*completeReq]{run: b.completeBatch, max: stmts, limit: maxStmtBatch, crowd: crowd, min: crowdSlots}
	b.dotx = batcher[*txReq]{run: b.runBatch, max: max(2, conns/txBatchShare), limit: maxTxBatch}
	if b.offset == nil && b.fake == nil {
		b.fixed = [2]*statements{b.makeStatements(false), b.makeStatements(true)}
	}
	if !s.PollOnly {
		b.l = newListener(pool, s, b.notifiedOutbox)
	}
	return b, nil
}

// instanceOwner is the owner stored in the records this engine claims: the
// label (Options.Owner; empty: host and pid) and a random instance id, so
// that it is unique per engine. The engine treats a started record with its
// own owner as an interrupted execution of its own (Owner, expiredSQL), so
// two engines sharing a label must never share it (a pid is reused after a
// restart, and a service may give every replica one label).
func instanceOwner(label string) string {
	if label == "" {
		host, _ := os.Hostname()
		label = host + "/" + strconv.Itoa(os.Getpid())
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	return label + "/" + hex.EncodeToString(r[:])
}

// txOwner names the owner of a key held by another process's uncommitted
// DoTx transaction.
const txOwner = "a DoTx transaction of another process"

// Info implements idemcore.Backend.
func (b *backend) Info() idemcore.Info {
	return idemcore.Info{Name: "postgres", Shared: true, Heartbeat: b.s.Heartbeat, Poll: b.s.PollInterval,
		PruneBatch: b.s.PruneBatch, ClaimTimeout: b.s.LockTimeout, ClaimRenew: b.s.Heartbeat, Transient: transient,
		Clock: b.Clock, ClaimFirst: true}
}

// Guard admits every call: no state of this backend refuses calls as a
// whole (a failed statement fails its call only).
func (b *backend) Guard() error { return nil }

// Holding implements idemcore.Backend: true on a goroutine running a RunTx fn.
func (b *backend) Holding() bool {
	if b.inFn.Load() == 0 {
		return false
	}
	_, ok := b.fnGoroutines.Load(goid.ID())
	return ok
}

// Close implements idemcore.Backend.
//
// The engine calls it after its last call returned, so every started record
// this backend claimed is an interrupted execution: Close ends their leases
// (lease_until in the past), so that other processes recover them at once
// instead of waiting a lease out.
func (b *backend) Close() error {
	b.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.s.LockTimeout)
		_, _ = b.exec(ctx, `UPDATE {schema}.idem_records SET lease_until = 'epoch' WHERE owner = $1::text AND state = 1`, b.owner)
		cancel()
		if b.l != nil {
			b.l.close()
		}
		if b.ownsPool {
			b.pool.Close()
		}
	})
	return nil
}

// observeCommit reports a commit of n records that took since t0, as the
// bbolt engine reports its commits: a claim's or a completion's statement
// (one or a batch, each its own transaction) or a DoTx transaction.
func (b *backend) observeCommit(t0 time.Time, n int) {
	if b.observer != nil && n > 0 {
		b.observer.Observe(idemcore.Event{Kind: idemcore.EventCommit, N: n, Duration: time.Since(t0)})
	}
}
