// Package memstore is an idemcore.Backend that keeps everything in memory:
// the smallest backend that keeps the contract, so that idemcore has tests of
// its own, free of bbolt and Postgres (the conformance suite, idemtest.Run,
// and the seam suite, idemtest.RunBackend, run on it). One process holds a
// Store at a time, as one holds a bbolt file: a claim never lapses, every
// started record is an orphan, and a restart is Close and Open on the same
// Store. Claims are fenced all the same (a per-key counter), so the seam
// suite's fencing cases hold here too. It is for tests: nothing survives the
// process.
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/goid"
)

// Store is the storage Backends open: records, the outbox, and the effect
// rows DoTx fns write (Tx.Put). The zero value is not ready; use NewStore.
type Store struct {
	mu      sync.Mutex
	open    bool
	recs    map[string]*idemcore.Record
	tokens  map[string]idemcore.Fence // per key: the last claim's token
	pending map[uint64]*idemcore.Message
	dead    map[uint64]*idemcore.Message
	seq     uint64
	effects map[string]string
	commits uint64
	writes  uint64
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		recs: map[string]*idemcore.Record{}, tokens: map[string]idemcore.Fence{},
		pending: map[uint64]*idemcore.Message{}, dead: map[uint64]*idemcore.Message{},
		effects: map[string]string{},
	}
}

// ErrInUse is returned by Open for a store another Backend holds.
var ErrInUse = errors.New("memstore: store in use")

// Effects returns a copy of the effect rows committed by DoTx fns (Tx.Put).
func (s *Store) Effects() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.effects)
}

// Backend is an idemcore.Backend over a Store; its transaction is *Tx.
type Backend struct {
	s       *Store
	now     func() time.Time
	commits chan struct{}
	holders sync.Map // goroutine id → struct{}: inside a RunTx fn

	mu      sync.Mutex
	claimed map[uint64]bool // outbox claims, in memory as bbolt's
	closed  bool
}

var _ idemcore.Backend[*Tx] = (*Backend)(nil)

// Open returns a Backend over s, or ErrInUse if another holds it. now is the
// engine's clock (Options.Now), which stamps Tx.Enqueue's messages; nil
// means time.Now.
func Open(s *Store, now func() time.Time) (*Backend, error) {
	if now == nil {
		now = time.Now
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open {
		return nil, ErrInUse
	}
	s.open = true
	return &Backend{s: s, now: now, commits: make(chan struct{}, 1), claimed: map[uint64]bool{}}, nil
}

// Tx is the transaction a DoTx fn receives: its writes (Put, Enqueue) are
// kept aside and commit with the done record, or not at all.
type Tx struct {
	b       *Backend
	key     string
	effects map[string]string
	msgs    []*idemcore.Message
	next    int
	ended   bool
}

// Put writes the effect row (key, value), committed with the call's record.
// After fn returned it fails with idemcore.ErrTxClosed.
func (tx *Tx) Put(key, value string) error {
	if tx.ended {
		return idemcore.ErrTxClosed
	}
	tx.effects[key] = value
	return nil
}

// Enqueue stores an outbox message for topic, ordered by the call's key, as
// idem.Tx.Enqueue does; errors as Backend.Enqueue's and
// idemcore.ValidateMessage's.
func (tx *Tx) Enqueue(topic string, payload []byte) error {
	if err := idemcore.ValidateMessage(topic, ""); err != nil {
		return err
	}
	m := &idemcore.Message{Topic: topic, Key: tx.key, Index: tx.next, OrderingKey: tx.key, Payload: payload,
		EnqueuedAt: tx.b.now().Round(0)}
	if err := tx.b.Enqueue(tx, m); err != nil {
		return err
	}
	tx.next++
	return nil
}

// Info names the backend "memory"; one process holds it (nothing shared, no
// heartbeat, no poll).
func (b *Backend) Info() idemcore.Info {
	return idemcore.Info{Name: "memory", Commits: func() (uint64, uint64) {
		b.s.mu.Lock()
		defer b.s.mu.Unlock()
		return b.s.commits, b.s.writes
	}}
}

// Guard refuses every call after Close with idemcore.ErrClosed.
func (b *Backend) Guard() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return idemcore.ErrClosed
	}
	return nil
}

// Close gives the store back; the Backend fails every call after it.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.s.mu.Lock()
	b.s.open = false
	b.s.mu.Unlock()
	return nil
}

// write runs fn under the store's lock as one commit, unless b is closed.
func (b *Backend) write(fn func(s *Store) error) error {
	if err := b.Guard(); err != nil {
		return err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := fn(s); err != nil {
		return err
	}
	s.commits++
	s.writes++
	return nil
}

// Lookup returns a copy of key's record, nil if none; at is zero (the
// engine's clock judges).
func (b *Backend) Lookup(_ context.Context, q idemcore.Lookup) (*idemcore.Record, time.Time, error) {
	if err := b.Guard(); err != nil {
		return nil, time.Time{}, err
	}
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	return cloneRecord(b.s.recs[q.Key]), time.Time{}, nil
}

// Owner answers an orphan: one process holds the store.
func (b *Backend) Owner(context.Context, *idemcore.Record) (idemcore.Ownership, error) {
	return idemcore.Ownership{}, nil
}

// Claim stores req.Started if the key holds what req expects (nothing live
// for a nil Prev, the version req.Prev names otherwise), else answers
// ClaimChanged with the record stored; the token is the key's counter, bumped.
func (b *Backend) Claim(_ context.Context, req idemcore.ClaimRequest) (res idemcore.ClaimResult, err error) {
	err = b.write(func(s *Store) error {
		key := req.Started.Key
		cur := s.recs[key]
		if req.Prev != nil && (cur == nil || cur.State != idemcore.StateStarted || cur.Attempt != req.Prev.Attempt || !cur.StartedAt.Equal(req.Prev.StartedAt)) {
			res = idemcore.ClaimResult{Status: idemcore.ClaimChanged, Current: cloneRecord(cur)}
			return nil
		}
		if req.Prev != nil {
			req.Started.Retention = max(req.Started.Retention, req.Prev.Retention)
			req.Started.KeptUntilResolved = req.Started.KeptUntilResolved || req.Prev.KeptUntilResolved
		}
		s.recs[key] = cloneRecord(req.Started)
		s.tokens[key]++
		res = idemcore.ClaimResult{Status: idemcore.Claimed, Claim: &idemcore.Claim{
			Key: key, Fingerprint: req.Started.Fingerprint, Token: s.tokens[key], Started: req.Started, Prev: req.Prev,
		}}
		return nil
	})
	return res, err
}

// Renew has nothing to do: a claim never lapses.
func (b *Backend) Renew(context.Context, *idemcore.Claim) error { return nil }

// fenced returns an error wrapping ErrFenced unless c holds its key.
func fenced(s *Store, c *idemcore.Claim) error {
	if s.tokens[c.Key] != c.Token {
		return fmt.Errorf("%w: key %q: claim %d, now %d", idemcore.ErrFenced, c.Key, c.Token, s.tokens[c.Key])
	}
	return nil
}

// Complete stores done in place of c's started record, fenced.
func (b *Backend) Complete(_ context.Context, c *idemcore.Claim, done *idemcore.Record) error {
	return b.write(func(s *Store) error {
		if err := fenced(s, c); err != nil {
			return err
		}
		s.recs[c.Key] = cloneRecord(done)
		return nil
	})
}

// Release stores restore in place of c's started record, or deletes it if
// restore is nil, fenced; c's token is then held by no claim.
func (b *Backend) Release(_ context.Context, c *idemcore.Claim, restore *idemcore.Record) error {
	return b.write(func(s *Store) error {
		if err := fenced(s, c); err != nil {
			return err
		}
		if restore == nil {
			delete(s.recs, c.Key)
		} else {
			s.recs[c.Key] = cloneRecord(restore)
		}
		s.tokens[c.Key]++
		return nil
	})
}

// RunTx runs fn once on the caller's goroutine with a new Tx, then commits
// its writes and the done record together (fenced, for a claim of Claim).
// A panic in fn is returned as an error; nothing commits.
func (b *Backend) RunTx(_ context.Context, c *idemcore.Claim, fn func(tx *Tx) (*idemcore.Record, error)) (err error) {
	if err := b.Guard(); err != nil {
		return err
	}
	tx := &Tx{b: b, key: c.Key, effects: map[string]string{}}
	done, err := b.run(tx, fn)
	if err != nil {
		return err
	}
	err = b.write(func(s *Store) error {
		if c.Token != 0 {
			if err := fenced(s, c); err != nil {
				return err
			}
		} else {
			s.tokens[c.Key]++
		}
		maps.Copy(s.effects, tx.effects)
		for _, m := range tx.msgs {
			s.pending[m.Seq] = m
		}
		s.recs[c.Key] = cloneRecord(done)
		return nil
	})
	if err == nil && len(tx.msgs) > 0 {
		b.signal()
	}
	return err
}

// run calls fn(tx) marked as holding, and ends tx.
func (b *Backend) run(tx *Tx, fn func(tx *Tx) (*idemcore.Record, error)) (done *idemcore.Record, err error) {
	id := goid.ID()
	b.holders.Store(id, struct{}{})
	defer func() {
		b.holders.Delete(id)
		tx.ended = true
		if p := recover(); p != nil {
			done, err = nil, fmt.Errorf("memstore: RunTx fn panicked: %v", p)
		}
	}()
	return fn(tx)
}

// Holding reports whether the calling goroutine runs a RunTx fn.
func (b *Backend) Holding() bool {
	_, ok := b.holders.Load(goid.ID())
	return ok
}

// WaitChange sleeps a moment, or until ctx ends: Owner never answers Owned.
func (b *Backend) WaitChange(ctx context.Context, _ string) error {
	wait, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	<-wait.Done()
	return ctx.Err()
}

// Forget deletes key's record and reports whether there was one.
func (b *Backend) Forget(_ context.Context, key string) (found bool, err error) {
	err = b.write(func(s *Store) error {
		_, found = s.recs[key]
		delete(s.recs, key)
		s.tokens[key]++
		return nil
	})
	return found, err
}

// Resolve stores fn's record in place of key's (nil deletes it).
func (b *Backend) Resolve(_ context.Context, key string, fn func(cur *idemcore.Record) (*idemcore.Record, error)) error {
	return b.write(func(s *Store) error {
		next, err := fn(cloneRecord(s.recs[key]))
		if err != nil {
			return err
		}
		if next == nil {
			delete(s.recs, key)
		} else {
			s.recs[key] = cloneRecord(next)
		}
		s.tokens[key]++
		return nil
	})
}

// Prune deletes the records req.Expired says so, req.Limit per commit.
func (b *Backend) Prune(ctx context.Context, req idemcore.PruneRequest) (res idemcore.PruneResult, err error) {
	limit := max(req.Limit, 1)
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		n := 0
		err = b.write(func(s *Store) error {
			for _, key := range slices.Sorted(maps.Keys(s.recs)) {
				r := s.recs[key]
				if n == limit {
					break
				}
				if !req.Expired(r) {
					continue
				}
				delete(s.recs, key)
				n++
				res.Deleted++
				if r.State == idemcore.StateStarted {
					res.Interrupted++
				}
			}
			return nil
		})
		if err != nil || n < limit {
			return res, err
		}
	}
}

// Scan calls fn on a copy of every record, by key, in one snapshot.
func (b *Backend) Scan(_ context.Context, fn func(r *idemcore.Record, err error) error) error {
	if err := b.Guard(); err != nil {
		return err
	}
	b.s.mu.Lock()
	recs := make([]*idemcore.Record, 0, len(b.s.recs))
	for _, key := range slices.Sorted(maps.Keys(b.s.recs)) {
		recs = append(recs, cloneRecord(b.s.recs[key]))
	}
	b.s.mu.Unlock()
	for _, r := range recs {
		if err := fn(r, nil); err != nil {
			return err
		}
	}
	return nil
}

// Enqueue adds m to tx's messages, with the store's next Seq.
func (b *Backend) Enqueue(tx *Tx, m *idemcore.Message) error {
	if tx.ended {
		return idemcore.ErrTxClosed
	}
	b.s.mu.Lock()
	b.s.seq++
	m.Seq = b.s.seq
	b.s.mu.Unlock()
	tx.msgs = append(tx.msgs, cloneMessage(m))
	return nil
}

// Committed is signalled after every commit that enqueued messages, and
// after RetryDead.
func (b *Backend) Committed() <-chan struct{} { return b.commits }

func (b *Backend) signal() {
	select {
	case b.commits <- struct{}{}:
	default:
	}
}

// ClaimDue claims, in memory, the due unclaimed head of each ordering key,
// up to limit, by Seq; Next is the earliest NextAttemptAt after now among
// the heads it left.
func (b *Backend) ClaimDue(_ context.Context, now time.Time, limit int) (due idemcore.Due, err error) {
	if err := b.Guard(); err != nil {
		return due, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	heads := map[string]*idemcore.Message{}
	for _, m := range b.s.pending {
		if h := heads[m.OrderingKey]; h == nil || m.Seq < h.Seq {
			heads[m.OrderingKey] = m
		}
	}
	hs := slices.SortedFunc(maps.Values(heads), func(a, b *idemcore.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, m := range hs {
		switch {
		case b.claimed[m.Seq]:
		case !m.NextAttemptAt.IsZero() && m.NextAttemptAt.After(now):
			if due.Next.IsZero() || m.NextAttemptAt.Before(due.Next) {
				due.Next = m.NextAttemptAt
			}
		case len(due.Messages) < limit:
			b.claimed[m.Seq] = true
			due.Messages = append(due.Messages, cloneMessage(m))
		}
	}
	return due, nil
}

// RenewClaim has nothing to do: claims are in memory and never lapse.
func (b *Backend) RenewClaim(context.Context, *idemcore.Message) (time.Time, error) {
	return time.Time{}, nil
}

// unclaim ends m's claim.
func (b *Backend) unclaim(seq uint64) {
	b.mu.Lock()
	delete(b.claimed, seq)
	b.mu.Unlock()
}

// notFound is the error for a message seq that is gone.
func notFound(seq uint64) error {
	return fmt.Errorf("%w: message %d", idemcore.ErrMessageNotFound, seq)
}

// Delivered deletes pending message m and ends its claim.
func (b *Backend) Delivered(_ context.Context, m *idemcore.Message) error {
	defer b.unclaim(m.Seq)
	return b.write(func(s *Store) error {
		if s.pending[m.Seq] == nil {
			return notFound(m.Seq)
		}
		delete(s.pending, m.Seq)
		return nil
	})
}

// Failed stores m back, or among the dead letters if m.Dead, and ends its
// claim.
func (b *Backend) Failed(_ context.Context, m *idemcore.Message) error {
	defer b.unclaim(m.Seq)
	return b.write(func(s *Store) error {
		if s.pending[m.Seq] == nil {
			return notFound(m.Seq)
		}
		if m.Dead {
			delete(s.pending, m.Seq)
			s.dead[m.Seq] = cloneMessage(m)
			return nil
		}
		s.pending[m.Seq] = cloneMessage(m)
		return nil
	})
}

// Messages calls fn on a copy of every pending message by Seq, then every
// dead letter by Seq, from one snapshot.
func (b *Backend) Messages(_ context.Context, fn func(m *idemcore.Message, err error) error) error {
	if err := b.Guard(); err != nil {
		return err
	}
	b.s.mu.Lock()
	var all []*idemcore.Message
	for _, set := range []map[uint64]*idemcore.Message{b.s.pending, b.s.dead} {
		for _, seq := range slices.Sorted(maps.Keys(set)) {
			all = append(all, cloneMessage(set[seq]))
		}
	}
	b.s.mu.Unlock()
	for _, m := range all {
		if err := fn(m, nil); err != nil {
			return err
		}
	}
	return nil
}

// RetryDead moves dead letter seq back to the pending messages, as revive
// leaves it.
func (b *Backend) RetryDead(_ context.Context, seq uint64, revive func(m *idemcore.Message) error) error {
	err := b.write(func(s *Store) error {
		d := s.dead[seq]
		if d == nil {
			return notFound(seq)
		}
		m := cloneMessage(d)
		if err := revive(m); err != nil {
			return err
		}
		delete(s.dead, seq)
		s.pending[seq] = m
		return nil
	})
	if err == nil {
		b.signal()
	}
	return err
}

// DropDead deletes dead letter seq.
func (b *Backend) DropDead(_ context.Context, seq uint64) error {
	return b.write(func(s *Store) error {
		if s.dead[seq] == nil {
			return notFound(seq)
		}
		delete(s.dead, seq)
		return nil
	})
}

// PruneDead deletes the dead letters expired says so, limit per commit.
func (b *Backend) PruneDead(ctx context.Context, expired func(m *idemcore.Message) bool, limit int) (int, error) {
	limit = max(limit, 1)
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n := 0
		err := b.write(func(s *Store) error {
			for _, seq := range slices.Sorted(maps.Keys(s.dead)) {
				if n == limit {
					break
				}
				if expired(cloneMessage(s.dead[seq])) {
					delete(s.dead, seq)
					n++
				}
			}
			return nil
		})
		total += n
		if err != nil || n < limit {
			return total, err
		}
	}
}

// cloneRecord copies r, so that neither the store nor its caller sees the
// other's later changes; nil stays nil, as do a nil Response and Err.
func cloneRecord(r *idemcore.Record) *idemcore.Record {
	if r == nil {
		return nil
	}
	c := *r
	if r.Response != nil {
		c.Response = append([]byte{}, r.Response...)
	}
	if r.Err != nil { // as stored: the code and the message, replayed, not fn's error
		c.Err = &idemcore.Error{Code: r.Err.Code, Message: r.Err.Message, Replayed: true}
	}
	return &c
}

// cloneMessage copies m; a nil Payload stays nil.
func cloneMessage(m *idemcore.Message) *idemcore.Message {
	c := *m
	if m.Payload != nil {
		c.Payload = append([]byte{}, m.Payload...)
	}
	return &c
}
