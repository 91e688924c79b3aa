package idem

import (
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// DefaultReplayCacheSize is the number of recently completed records kept in
// memory to answer replays without a read transaction.
const DefaultReplayCacheSize = 16384

const cacheShards = 32

// replayCache holds the done records completed most recently, so that the
// retry of a recent call (the common case: seconds after the first) is
// answered from memory. It is bounded by count (first in, first out per
// shard), not by the key space: the records live in the file. An entry is
// only a copy of a committed done record, so a miss is never wrong, just
// slower; expiry is checked on every hit, Forget removes the entry.
type replayCache struct {
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu   sync.Mutex
	m    map[string]*Record
	ring []string // keys in insertion order; ring[next] is the oldest
	next int
}

func newReplayCache(size int) *replayCache {
	if size <= 0 {
		return nil
	}
	per := max(1, size/cacheShards)
	c := &replayCache{}
	for i := range c.shards {
		c.shards[i] = cacheShard{m: make(map[string]*Record, per), ring: make([]string, 0, per)}
	}
	return c
}

func (c *replayCache) shard(key string) *cacheShard {
	return &c.shards[xxhash.Sum64String(key)%cacheShards]
}

// get returns the cached done record of key. The record is shared: callers
// must not modify it (replay clones the response).
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

// put remembers r, a committed done record, evicting the shard's oldest.
func (c *replayCache) put(r *Record) {
	if c == nil {
		return
	}
	s := c.shard(r.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[r.Key]; ok {
		s.m[r.Key] = r
		return
	}
	if len(s.ring) < cap(s.ring) {
		s.ring = append(s.ring, r.Key)
	} else {
		delete(s.m, s.ring[s.next])
		s.ring[s.next] = r.Key
		s.next = (s.next + 1) % len(s.ring)
	}
	s.m[r.Key] = r
}

// forget drops key (its ring slot stays until it is overwritten).
func (c *replayCache) forget(key string) {
	if c == nil {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

// cached answers a replay from the cache: ok is false on a miss or for an
// entry past the retention window at now.
func (e *Engine) cached(key string, now time.Time) (*Record, bool) {
	r := e.cache.get(key)
	if r == nil || !now.Before(r.CompletedAt.Add(e.opts.Retention)) {
		return nil, false
	}
	return r, true
}
