package testkit_test

import (
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
)

// TestOutboxHistoryRejects shows the outbox checker is not vacuous: it
// accepts a history with retries and redeliveries, and rejects one with a
// lost message, one out of order, one with a phantom (a rolled back
// message), and one with a wrong downstream key.
func TestOutboxHistoryRejects(t *testing.T) {
	msg := func(key string, idx int, payload string) idem.Message {
		return idem.Message{Key: key, OrderingKey: key, Index: idx, Payload: []byte(payload), DownstreamKey: idem.DownstreamKey(key, idx)}
	}
	committed := map[string][]string{"a": {"a0", "a1"}, "b": {"b0"}}
	type attempt struct {
		m  idem.Message
		ok bool
	}
	for _, tc := range []struct {
		name string
		h    []attempt
		bad  int
	}{
		{"each once", []attempt{{msg("a", 0, "a0"), true}, {msg("b", 0, "b0"), true}, {msg("a", 1, "a1"), true}}, 0},
		{"a failure retried, a redelivery", []attempt{{msg("a", 0, "a0"), false}, {msg("b", 0, "b0"), true}, {msg("a", 0, "a0"), true},
			{msg("a", 0, "a0"), true}, {msg("a", 1, "a1"), true}}, 0},
		{"a lost message", []attempt{{msg("a", 0, "a0"), true}, {msg("b", 0, "b0"), true}}, 1},
		{"a lost message: only failed attempts", []attempt{{msg("a", 0, "a0"), true}, {msg("a", 1, "a1"), false}, {msg("b", 0, "b0"), true}}, 1},
		{"out of order", []attempt{{msg("a", 1, "a1"), true}, {msg("a", 0, "a0"), true}, {msg("b", 0, "b0"), true}}, 1},
		{"out of order: the earlier one had failed", []attempt{{msg("a", 0, "a0"), false}, {msg("a", 1, "a1"), true}, {msg("a", 0, "a0"), true}, {msg("b", 0, "b0"), true}}, 1},
		{"a phantom", []attempt{{msg("a", 0, "a0"), true}, {msg("a", 1, "a1"), true}, {msg("b", 0, "b0"), true}, {msg("c", 0, "c0"), true}}, 1},
		{"a phantom payload", []attempt{{msg("a", 0, "a0"), true}, {msg("a", 1, "rolled back"), true}, {msg("a", 1, "a1"), true}, {msg("b", 0, "b0"), true}}, 1},
		{"a wrong downstream key", []attempt{{msg("a", 0, "a0"), true}, {func() idem.Message { m := msg("a", 1, "a1"); m.DownstreamKey = "x"; return m }(), true},
			{msg("b", 0, "b0"), true}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ms []idem.Message
			var ok []bool
			for _, a := range tc.h {
				ms, ok = append(ms, a.m), append(ok, a.ok)
			}
			bad := testkit.OutboxHistory(committed, ms, ok)
			if len(bad) != tc.bad {
				t.Fatalf("%d violations %q, want %d", len(bad), bad, tc.bad)
			}
		})
	}
}
