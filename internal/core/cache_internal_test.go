package core

import (
	"fmt"
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
