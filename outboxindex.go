package idem

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
)

// outboxIndex is the bbolt backend's index of the pending outbox messages,
// in memory, behind ClaimDue: the pending sequence numbers of every ordering
// key in order, the claimed ones, and the unclaimed heads by next attempt.
// The dispatcher (idemcore) never sees it; it only claims.
//
// The outbox only grows at its end (bbolt's NextSequence, in commit order),
// so after a commit the index reads only what follows the last sequence it
// saw (dirty); RetryDead, which puts an old sequence back, asks for a full
// reload (rescan). Loads run under mu in one read transaction, and the
// writes that move a message on (Delivered, Failed) update the index under
// mu after their commit, so a load never undoes them; a message that a load
// read but that is gone when claimed is dropped then.
type outboxIndex struct {
	mu      sync.Mutex
	queues  map[string]*okQueue // by ordering key
	entries map[uint64]*ixEntry // by seq: every pending seq in queues
	claimed map[uint64]struct{} // seqs held by the dispatcher, kept across reloads
	heads   headHeap            // unclaimed heads by next attempt, then seq
	lastSeq uint64

	dirty  atomic.Bool // commits since the last load: read past lastSeq
	rescan atomic.Bool // read everything again
}

type okQueue struct {
	seqs   []uint64 // pending, in enqueue order; seqs[0] is the head
	pushed bool     // the head is in heads
}

type ixEntry struct {
	ok   string
	next time.Time
}

func newOutboxIndex() *outboxIndex {
	ix := &outboxIndex{claimed: make(map[uint64]struct{})}
	ix.rescan.Store(true)
	return ix
}

// load brings the index up to date with the file, under ix.mu, and returns
// the seqs of the pending messages that fail to decode (left out of it).
func (ix *outboxIndex) load(db *bbolt.DB) (corrupt []uint64, err error) {
	full := ix.rescan.Swap(false)
	if !full && !ix.dirty.Swap(false) {
		return nil, nil
	}
	if full {
		ix.dirty.Store(false)
		ix.queues, ix.entries, ix.heads, ix.lastSeq = make(map[string]*okQueue), make(map[uint64]*ixEntry), nil, 0
	}
	var added []string
	err = view(db, func(tx *bbolt.Tx) error {
		c := outboxBucket(tx).Cursor()
		k, v := c.First()
		if !full {
			k, v = c.Seek(u64Key(ix.lastSeq + 1))
		}
		for ; k != nil; k, v = c.Next() {
			seq, ok := parseU64Key(k)
			if !ok {
				continue
			}
			ix.lastSeq = max(ix.lastSeq, seq)
			m, err := decodeMessage(seq, v)
			if err != nil {
				corrupt = append(corrupt, seq)
				continue
			}
			q := ix.queues[m.OrderingKey]
			if q == nil {
				q = &okQueue{}
				ix.queues[m.OrderingKey] = q
			}
			q.seqs = append(q.seqs, seq)
			ix.entries[seq] = &ixEntry{ok: m.OrderingKey, next: m.NextAttemptAt}
			if len(q.seqs) == 1 {
				added = append(added, m.OrderingKey)
			}
		}
		return nil
	})
	if err != nil {
		ix.rescan.Store(true)
		return nil, err
	}
	for _, ok := range added {
		ix.consider(ok)
	}
	return corrupt, nil
}

// consider puts ordering key ok's head among the heads if it is unclaimed
// and not there yet, and forgets a drained key.
func (ix *outboxIndex) consider(ok string) {
	q := ix.queues[ok]
	if q == nil {
		return
	}
	if len(q.seqs) == 0 {
		delete(ix.queues, ok)
		return
	}
	if _, held := ix.claimed[q.seqs[0]]; held || q.pushed {
		return
	}
	q.pushed = true
	heap.Push(&ix.heads, head{at: ix.entries[q.seqs[0]].next, seq: q.seqs[0], ok: ok})
}

// due pops up to limit heads due at now, marks them claimed and returns
// their seqs, with the next attempt of the first head left (zero if none).
func (ix *outboxIndex) due(now time.Time, limit int) (seqs []uint64, next time.Time) {
	for len(seqs) < limit && len(ix.heads) > 0 && !ix.heads[0].at.After(now) {
		h := heap.Pop(&ix.heads).(head)
		q := ix.queues[h.ok]
		if q == nil || len(q.seqs) == 0 || q.seqs[0] != h.seq {
			continue // stale
		}
		q.pushed = false
		ix.claimed[h.seq] = struct{}{}
		seqs = append(seqs, h.seq)
	}
	if len(ix.heads) > 0 {
		next = ix.heads[0].at
	}
	return seqs, next
}

// remove takes seq out of the index (delivered, dead, gone or undecodable)
// and looks at its key's next head.
func (ix *outboxIndex) remove(seq uint64) {
	delete(ix.claimed, seq)
	en := ix.entries[seq]
	if en == nil {
		return
	}
	delete(ix.entries, seq)
	if q := ix.queues[en.ok]; q != nil {
		for i, s := range q.seqs {
			if s == seq {
				q.seqs = append(q.seqs[:i:i], q.seqs[i+1:]...)
				if i == 0 && q.pushed {
					// Its stale heap entry is skipped when popped.
					q.pushed = false
				}
				break
			}
		}
	}
	ix.consider(en.ok)
}

// release ends seq's claim; it is due again at next.
func (ix *outboxIndex) release(seq uint64, next time.Time) {
	delete(ix.claimed, seq)
	if en := ix.entries[seq]; en != nil {
		en.next = next
		ix.consider(en.ok)
	}
}

type head struct {
	at  time.Time
	seq uint64
	ok  string
}

type headHeap []head

func (h headHeap) Len() int { return len(h) }
func (h headHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h headHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *headHeap) Push(x any)   { *h = append(*h, x.(head)) }
func (h *headHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
