package idemcore

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReplayCacheIsBoundedByBytes(t *testing.T) {
	const budget = 1 << 20
	c := newReplayCache(budget)
	resp := make([]byte, 2000)
	for i := range 5000 { // 10 MB of responses through a 1 MiB cache
		c.put(&Record{Key: fmt.Sprintf("k%d", i), State: StateDone, Response: resp})
	}
	total, n := 0, 0
	for i := range c.shards {
		s := &c.shards[i]
		require.LessOrEqual(t, s.bytes, s.maxBytes)
		total += s.bytes
		n += len(s.m)
	}
	require.LessOrEqual(t, total, budget)
	require.Positive(t, n)
	require.NotNil(t, c.get("k4999"), "the newest stay")
	require.Nil(t, c.get("k0"), "the oldest go")

	big := &Record{Key: "big", State: StateDone, Response: make([]byte, budget/cacheShards)}
	c.put(big)
	require.Nil(t, c.get("big"), "a record larger than an eighth of a shard is not cached")

	c.forget("k4999")
	require.Nil(t, c.get("k4999"))
	c.put(&Record{Key: "k4998", State: StateDone, Response: resp}) // replaces
	for i := range c.shards {
		require.LessOrEqual(t, c.shards[i].bytes, c.shards[i].maxBytes)
	}
}

// queueLen is the number of slots in s's queue, stale ones included.
func (s *cacheShard) queueLen() int { return len(s.fifo) - s.head }

// The queue is memory too: re-putting a key (Forget then Do, or expiry then a
// new execution) and forgetting keys must not grow it beyond what the byte
// budget covers, whatever the sequence of calls.
func TestReplayCacheQueueStaysBoundedUnderReputs(t *testing.T) {
	for _, tc := range []struct {
		name string
		step func(c *replayCache, i int)
	}{
		{"re-put one key", func(c *replayCache, _ int) {
			c.put(&Record{Key: "hot", State: StateDone, Response: []byte("r")})
		}},
		{"forget then put one key", func(c *replayCache, _ int) {
			c.forget("hot")
			c.put(&Record{Key: "hot", State: StateDone, Response: []byte("r")})
		}},
		{"re-put a few keys", func(c *replayCache, i int) {
			c.put(&Record{Key: fmt.Sprintf("k%d", i%7), State: StateDone})
		}},
		{"put and forget new keys", func(c *replayCache, i int) {
			k := fmt.Sprintf("k%d", i)
			c.put(&Record{Key: k, State: StateDone})
			c.forget(k)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newReplayCache(1 << 20) // far more than the entries need: no eviction
			for i := range 100_000 {
				tc.step(c, i)
			}
			for i := range c.shards {
				s := &c.shards[i]
				require.LessOrEqual(t, s.queueLen(), 2*len(s.m)+queueSlack,
					"shard %d: %d queue slots for %d entries", i, s.queueLen(), len(s.m))
				require.LessOrEqual(t, s.bytes, s.maxBytes)
			}
		})
	}
}

// A stale queue slot (of a key put again since) must not evict the key's
// newer entry: eviction goes by age of the entry, not of the key.
func TestReplayCacheEvictsByEntryAge(t *testing.T) {
	c := newReplayCache(cacheShards * 8 * (entryOverhead + 100))
	s := c.shard("a")
	var same []string // keys of a's shard
	for i := 0; len(same) < 40; i++ {
		if k := fmt.Sprintf("k%d", i); c.shard(k) == s {
			same = append(same, k)
		}
	}
	rec := func(k string) *Record { return &Record{Key: k, State: StateDone, Response: make([]byte, 100-len(k))} }
	c.put(rec("a"))
	c.put(rec(same[0]))
	c.put(rec("a")) // a is now newer than same[0]
	for _, k := range same[1:8] {
		c.put(rec(k)) // fills the shard: the oldest entry goes
	}
	require.Nil(t, c.get(same[0]), "the oldest entry is evicted first")
	require.NotNil(t, c.get("a"), "a was put again after same[0]: it stays")
}

// The budget is of memory, not of an estimate: after any sequence of puts and
// forgets, the heap the cache holds (its records, map and queue; the keys and
// responses too, which the test allocates for each put, as remember copies
// them) stays within ReplayCacheBytes. Tiny entries are the hard case: the
// per-entry overhead is all there is.
func TestReplayCacheHeapStaysWithinBudget(t *testing.T) {
	const budget = 4 << 20
	for _, tc := range []struct {
		name string
		step func(c *replayCache, i int)
	}{
		{"new tiny keys", func(c *replayCache, i int) {
			c.put(&Record{Key: fmt.Sprintf("k%07d", i), State: StateDone, Response: []byte{}})
		}},
		{"put and forget", func(c *replayCache, i int) {
			k := fmt.Sprintf("k%07d", i%50_000)
			c.put(&Record{Key: k, State: StateDone, Response: []byte{}})
			if i%3 == 0 {
				c.forget(k)
			}
		}},
		{"re-puts of a few keys among many", func(c *replayCache, i int) {
			k := fmt.Sprintf("k%07d", i)
			if i%2 == 0 {
				k = fmt.Sprintf("hot%d", i%10)
			}
			c.put(&Record{Key: k, State: StateDone, Response: []byte("r"), Err: &Error{Code: "c", Message: "m"}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			before := ms.HeapAlloc
			c := newReplayCache(budget)
			for i := range 300_000 {
				tc.step(c, i)
			}
			runtime.GC()
			runtime.ReadMemStats(&ms)
			held := int64(ms.HeapAlloc) - int64(before)
			require.LessOrEqual(t, held, int64(budget), "the cache holds %d bytes for a budget of %d", held, budget)
			runtime.KeepAlive(c)
		})
	}
}
