package idemcore

import "sync/atomic"

// foundRate is a moving average of how often Do's leaders found their key
// with a live record (a replay, a conflict, a key in progress) rather than
// free, over about the last foundWindow calls: on a backend that can claim
// first (Info.ClaimFirst), it picks the cheaper path for the next call.
// Claiming first saves a fresh key its Lookup; on a key with a record, the
// claim's statement costs more than the Lookup would have (on Postgres, an
// INSERT's executor for a row it does not insert), so a stream of retries
// is served by looking up first.
//
// Its updates race (a load and a store, no loop): an update lost among
// concurrent calls moves the average a little less, which a heuristic
// can afford on the call path.
type foundRate struct {
	v atomic.Int64 // fixed point: foundOne is every call found its key
}

const (
	foundOne    = 1 << 16
	foundWindow = 32
	// foundAbove is the share of calls finding a record above which Do
	// looks up first: with a Lookup's round trip saved per fresh key and
	// a claim's extra cost per found key of about half that, claiming
	// first pays until some two calls in three find a record.
	foundAbove = foundOne * 2 / 3
)

// add counts one leader's finding: found a live record, or the key free.
func (f *foundRate) add(found bool) {
	x := int64(0)
	if found {
		x = foundOne
	}
	v := f.v.Load()
	f.v.Store(v + (x-v)/foundWindow)
}

// mostly reports whether most recent calls found a record.
func (f *foundRate) mostly() bool { return f.v.Load() > foundAbove }
