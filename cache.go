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
	// and error text: the Record, the map slot, and two queue slots (its own
	// and at most one stale slot per entry, see cacheShard.stale).
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
	mu   sync.Mutex
	m    map[string]*Record
	fifo []queued // entries in insertion order, oldest at head
	head int
	// stale counts the queue slots from head on whose entry is gone (evicted,
	// forgotten, or put again since): compacting once they outnumber the
	// entries keeps the queue within two slots an entry, whatever the
	// sequence of puts and forgets.
	stale    int
	bytes    int
	maxBytes int
}

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
		} else {
			s.stale--
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
		s.stale++
	}
}

// compact rewrites the queue without its stale slots once they outnumber
// the entries (amortised: each rewrite removes more slots than it keeps), and
// drops the consumed head once it is half the queue.
func (s *cacheShard) compact() {
	if s.stale > len(s.m) {
		live := s.fifo[:0]
		for _, q := range s.fifo[s.head:] {
			if s.m[q.key] == q.rec {
				live = append(live, q)
			}
		}
		clear(s.fifo[len(live):])
		s.fifo, s.head, s.stale = live, 0, 0
		return
	}
	if s.head > len(s.fifo)/2 {
		n := copy(s.fifo, s.fifo[s.head:])
		clear(s.fifo[n:])
		s.fifo, s.head = s.fifo[:n], 0
	}
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
func (e *Engine) cached(key string, now time.Time) (*Record, bool) {
	r := e.cache.get(key)
	if r == nil || !e.live(r, now) {
		return nil, false
	}
	return r, true
}
