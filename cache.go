package idem

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
	// entryOverhead approximates an entry's bytes beside its key, response
	// and error text: the Record, the map slot, the queue slot.
	entryOverhead = 160
)

// replayCache holds the done records completed most recently, so that the
// retry of a recent call (the common case: seconds after the first) is
// answered from memory. It is bounded by bytes, first in first out per shard,
// not by the key space: the records live in the file. A record larger than an
// eighth of a shard is not cached. An entry is only a copy of a committed done
// record, so a miss is never wrong, just slower; expiry is checked on every
// hit, Forget removes the entry.
type replayCache struct {
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu       sync.Mutex
	m        map[string]*Record
	fifo     []string // keys in insertion order, oldest at head
	head     int
	bytes    int
	maxBytes int
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
		n += len(r.Err.Code) + len(r.Err.Message)
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

// put remembers r, a committed done record, evicting the shard's oldest
// entries until it fits.
func (c *replayCache) put(r *Record) {
	if c == nil {
		return
	}
	s := c.shard(r.Key)
	size := entrySize(r)
	if size > s.maxBytes/8 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[r.Key]; ok {
		s.bytes -= entrySize(old)
		delete(s.m, r.Key) // its queue slot is skipped when it comes up
	}
	for s.bytes+size > s.maxBytes && s.head < len(s.fifo) {
		k := s.fifo[s.head]
		s.fifo[s.head] = ""
		s.head++
		if old, ok := s.m[k]; ok {
			s.bytes -= entrySize(old)
			delete(s.m, k)
		}
	}
	if s.head > len(s.fifo)/2 { // compact the queue
		s.fifo = append(s.fifo[:0], s.fifo[s.head:]...)
		s.head = 0
	}
	s.fifo = append(s.fifo, r.Key)
	s.m[r.Key] = r
	s.bytes += size
}

// forget drops key (its queue slot is skipped when it comes up).
func (c *replayCache) forget(key string) {
	if c == nil {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	if old, ok := s.m[key]; ok {
		s.bytes -= entrySize(old)
		delete(s.m, key)
	}
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
