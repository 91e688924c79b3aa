package testkit

import (
	"fmt"

	"github.com/idemkit/idem/idemcore"
)

// OutboxHistory checks a dispatcher's history against what committed, for
// the outbox's promise (DESIGN.md, contract 10: at least once, in order per
// ordering key, with the downstream key passed on). committed holds, per
// ordering key, the payloads of the messages that committed, in enqueue
// order (Message.Index 0, 1, …); attempts are every handler call in the
// order they happened, ok whether each succeeded (Recorder.Log). It returns
// every violation found, or none:
//
//   - a phantom: an attempt of a message that never committed (a rolled
//     back DoTx's, or one that is not the committed execution's: another
//     payload at that index);
//   - out of order: an attempt of a message while an earlier message of
//     its ordering key had no successful attempt yet;
//   - a lost message: a committed message without a successful attempt;
//   - a wrong downstream key (not idemcore.DownstreamKey(Key, Index)).
func OutboxHistory(committed map[string][]string, attempts []idemcore.Message, ok []bool) []string {
	var bad []string
	delivered := map[string]int{} // per ordering key: how many delivered, in order
	seen := map[string]map[int]bool{}
	for i, m := range attempts {
		want := committed[m.OrderingKey]
		if m.Index < 0 || m.Index >= len(want) || want[m.Index] != string(m.Payload) {
			bad = append(bad, fmt.Sprintf("attempt %d: %s[%d] %q never committed", i, m.OrderingKey, m.Index, m.Payload))
			continue
		}
		if m.DownstreamKey != idemcore.DownstreamKey(m.Key, m.Index) {
			bad = append(bad, fmt.Sprintf("attempt %d: %s[%d] has downstream key %q", i, m.OrderingKey, m.Index, m.DownstreamKey))
		}
		if seen[m.OrderingKey] == nil {
			seen[m.OrderingKey] = map[int]bool{}
		}
		// Every earlier message of the ordering key must have succeeded.
		if n := delivered[m.OrderingKey]; m.Index > n {
			bad = append(bad, fmt.Sprintf("attempt %d: %s[%d] before %s[%d] was delivered", i, m.OrderingKey, m.Index, m.OrderingKey, n))
		}
		if ok[i] && !seen[m.OrderingKey][m.Index] {
			seen[m.OrderingKey][m.Index] = true
			for seen[m.OrderingKey][delivered[m.OrderingKey]] {
				delivered[m.OrderingKey]++
			}
		}
	}
	for k, want := range committed {
		for j := range want {
			if !seen[k][j] {
				bad = append(bad, fmt.Sprintf("%s[%d] %q committed and was never delivered", k, j, want[j]))
			}
		}
	}
	return bad
}
