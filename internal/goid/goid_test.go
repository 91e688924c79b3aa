package goid

import (
	"sync"
	"testing"
)

// Every live goroutine has its own ID, the same on every call; never 0.
func TestIDsOfLiveGoroutinesDiffer(t *testing.T) {
	const n = 200
	ids := make([]uint64, n)
	var start, done sync.WaitGroup
	release := make(chan struct{})
	start.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ids[i] = ID()
			start.Done()
			<-release // alive while the others read theirs
			if again := ID(); again != ids[i] {
				t.Errorf("goroutine %d: ID %d, then %d", i, ids[i], again)
			}
		}()
	}
	start.Wait()
	close(release)
	done.Wait()
	seen := map[uint64]bool{ID(): true}
	for i, id := range ids {
		if id == 0 || seen[id] {
			t.Fatalf("goroutine %d: ID %d is zero or another live goroutine's", i, id)
		}
		seen[id] = true
	}
}

// The stack header's number is what the fallback reads.
func TestStackIDIsNonZeroAndStable(t *testing.T) {
	a, b := stackID(), stackID()
	if a == 0 || a != b {
		t.Fatalf("stackID: %d, %d", a, b)
	}
}
