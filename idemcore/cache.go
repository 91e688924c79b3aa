package idemcore

import (
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// DefaultReplayCacheBytes bounds the memory of the replay cache: 16 MiB of
// recently completed records (their keys, responses and errors).
const DefaultReplayCacheBytes = 16 << 20

const (
	cacheShards = 32
	// entryOverhead bounds an entry's heap bytes beside its key, response
	// and error: the Record (144 bytes, its allocation's size class), its
	// map slot (24 bytes, up to 57 with the map's load factor and growth),
	// and its queue slots (24 bytes each, at most two an entry in an array
	// of at most 2.5 slots an entry, see compact): about 260 bytes, and up
	// to 310 measured under churn (a map of deleted keys keeps some of its
	// growth), rounded up with room to spare.
	// TestReplayCacheHeapStaysWithinBudget measures it.
	entryOverhead = 352
	// errorOverhead is a stored error's bytes beside its code and message:
	// the Error (64 bytes, its allocation's size class).
	errorOverhead = 64
)

// replayCache holds the done records completed most recently, so that the
// retry of a recent call (the common case: seconds after the first) is
// answered from memory. It is bounded by bytes, first in first out per shard,
// not by the key space: the records live in the file. A record larger than an
// eighth of a shard is not cached. An entry is only a copy of a committed done
// record, so a miss is never wrong, just slower; expiry is checked on every
// hit, Forget removes the entry.
//
// An entry is always the record the store holds, or an expired one, only
// while this engine makes every write of the store's records: bbolt, where
// one process holds the file (its lock), every write of a record runs in this
// engine under the key, and a done record changes only by Forget (which drops
// the entry under the key) or by expiry (which every hit checks). A store
// that engines in several processes share (Info.Shared: Postgres) changes
// under the engine (another process's Forget, Resolve, or a new outcome after
// one), and a notification of it (NOTIFY) would arrive late or, in PollOnly
// mode, never: there the engine keeps no cache, and every replay reads the
// store (one SELECT, as a check of an entry would cost; bench/RESULTS.md).
type replayCache struct {
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.Mutex
	m  map[string]*Record
	// fifo holds the entries in insertion order, oldest at head, and stale
	// slots of entries gone since (forgotten, or put again), which evict
	// nothing; compact bounds it to two slots an entry.
	fifo     []queued
	head     int
	bytes    int
	maxBytes int
}

// queueSlack is the queue slots a shard may hold beside two an entry.
const queueSlack = 16

// queued is a queue slot: the entry it was made for, so that a slot of a key
// put again since is recognised as stale and evicts nothing.
type queued struct {
	key string
	rec *Record
}

func newReplayCache(maxBytes int) *replayCache {
	if maxBytes <= 0 {
		return nil
	}
	c := &replayCache{}
	for i := range c.shards {
		c.shards[i] = cacheShard{m: make(map[string]*Record), maxBytes: max(1, maxBytes/cacheShards)}
	}
	return c
}

func entrySize(r *Record) int {
	n := entryOverhead + len(r.Key) + len(r.Response)
	if r.Err != nil {
		n += errorOverhead + len(r.Err.Code) + len(r.Err.Message)
	}
	return n
}

func (c *replayCache) shard(key string) *cacheShard {
	return &c.shards[xxhash.Sum64String(key)%cacheShards]
}

// get returns the cached done record of key. The record is shared: callers
// must not modify it (replay copies what it hands out).
func (c *replayCache) get(key string) *Record {
	if c == nil {
		return nil
	}
	s := c.shard(key)
	s.mu.Lock()
	r := s.m[key]
	s.mu.Unlock()
	return r
}

// put remembers r, a committed done record, in place of any older entry of
// its key, evicting the shard's oldest entries until it fits. A record larger
// than an eighth of the shard is not cached (the older entry goes all the same).
func (c *replayCache) put(r *Record) {
	if c == nil {
		return
	}
	s := c.shard(r.Key)
	size := entrySize(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop(r.Key) // an older entry of the key must not answer for the new record
	if size > s.maxBytes/8 {
		s.compact()
		return
	}
	for s.bytes+size > s.maxBytes && s.head < len(s.fifo) {
		q := s.fifo[s.head]
		s.fifo[s.head] = queued{}
		s.head++
		if s.m[q.key] == q.rec {
			s.bytes -= entrySize(q.rec)
			delete(s.m, q.key)
		}
	}
	s.fifo = append(s.fifo, queued{r.Key, r})
	s.m[r.Key] = r
	s.bytes += size
	s.compact()
}

// drop removes key's entry, if any; its queue slot becomes stale.
func (s *cacheShard) drop(key string) {
	if old, ok := s.m[key]; ok {
		s.bytes -= entrySize(old)
		delete(s.m, key)
	}
}

// compact rewrites the queue, without its consumed head and its stale
// slots, into an array a quarter larger than the entries, once it is longer
// than twice the entries (plus queueSlack): so it never is, whatever the
// sequence of puts and forgets, and its array never holds much more (append
// grows it to about 2.5 slots an entry at most before the next rewrite). Each
// rewrite follows at least as many puts as it keeps slots: amortised O(1).
func (s *cacheShard) compact() {
	if len(s.fifo) <= 2*len(s.m)+queueSlack {
		return
	}
	live := make([]queued, 0, len(s.m)+len(s.m)/4+queueSlack)
	for _, q := range s.fifo[s.head:] {
		if s.m[q.key] == q.rec {
			live = append(live, q)
		}
	}
	s.fifo, s.head = live, 0
}

// forget drops key (its queue slot is skipped when it comes up, or
// compacted away).
func (c *replayCache) forget(key string) {
	if c == nil {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	s.drop(key)
	s.compact()
	s.mu.Unlock()
}

// cached answers a replay from the cache: ok is false on a miss or for an
// entry past the retention window at now.
func (e *Engine[T]) cached(key string, now time.Time) (*Record, bool) {
	r := e.cache.get(key)
	if r == nil || !e.live(r, now) {
		return nil, false
	}
	return r, true
}
