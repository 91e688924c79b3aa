package robustness

import (
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// The journal's own power cuts (issue 20): the workload (its Do and DoTx
// calls both go through the journal), killed at a moment the parent picks
// by watching the FUSE layer, then the power cut.
// The watch holds the layer's lock while it kills, so no write or sync of
// the child lands between what it saw and the kill.
var journalCuts = []struct {
	name string
	// at reports, under the layer's lock, whether now is the moment.
	at func(f *faultFS) bool
}{
	// A frame written to a segment, not yet synced: its caller is not
	// answered, and the cut drops or tears it (a torn tail).
	{"inside a journal append", func(f *faultFS) bool { return unsynced(f, true) }},
	// Every write synced, the journal's frames ahead of bbolt (the
	// checkpoint comes catchUpDelay later): Open must replay them.
	{"between the journal's sync and bbolt's catch-up", func(f *faultFS) bool { return !unsynced(f, true) && !unsynced(f, false) }},
	// bbolt's pages written by a checkpoint, not yet synced: the cut
	// drops or tears them, and bbolt's last durable meta still holds.
	{"during a checkpoint", func(f *faultFS) bool { return unsynced(f, false) }},
}

// unsynced reports whether the journal's segments (or, with !journal, the
// bbolt file) have writes not yet synced.
func unsynced(f *faultFS, journal bool) bool {
	for rel, us := range f.undo {
		if len(us) > 0 && strings.Contains(rel, ".journal") == journal {
			return true
		}
	}
	return false
}

// TestPowerCutInTheJournal cuts the power at each of journalCuts, rounds(3)
// times each, round i with the cut mode all, suffix, harsh in turn (see cut):
// every answer a caller got replays unchanged after the reopen (which replays
// the journal), bbolt's check passes, and a Do re-executed only with
// Recovered set.
func TestPowerCutInTheJournal(t *testing.T) {
	r := rand.New(rand.NewPCG(seed(t), 20))
	for _, at := range journalCuts {
		t.Run(at.name, func(t *testing.T) {
			replayed := uint64(0)
			var st cutStats
			for round := range rounds(3) {
				f := mountFaultFS(t)
				f.mu.Lock()
				f.syncDelay = time.Millisecond
				f.mu.Unlock()
				dir := t.TempDir()
				ackPath, ledgerPath := filepath.Join(dir, "acks"), filepath.Join(dir, "ledger")
				const n = 600
				cmd := child(t, "workload", "IDEM_DB="+filepath.Join(f.mnt, "idem.db"), "IDEM_ACKS="+ackPath,
					"IDEM_LEDGER="+ledgerPath, "IDEM_KEYS="+strconv.Itoa(n))
				require.NoError(t, cmd.Start())
				warm := 20 + r.IntN(200)
				for deadline := time.Now().Add(20 * time.Second); len(readAcks(t, ackPath)) < warm && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				hit := false
				for deadline := time.Now().Add(20 * time.Second); !hit && time.Now().Before(deadline); {
					f.mu.Lock()
					if hit = at.at(f); hit {
						require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
					}
					f.mu.Unlock()
					if !hit {
						time.Sleep(50 * time.Microsecond)
					}
				}
				if !hit {
					require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
				}
				_ = cmd.Wait()
				require.True(t, hit, "round %d: the moment came within 20s", round)
				st.add(f.powerCut(t, r, []cut{cutAll, cutSuffix, cutHarsh}[round%3]))

				path := filepath.Join(f.under, "idem.db")
				boltkit.Check(t, path)
				e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
				require.NoError(t, err, "round %d: the file opens after the power cut", round)
				replayed += e.Stats().Replayed
				l, err := openLedger(ledgerPath)
				require.NoError(t, err)
				checkWorkload(t, e, l, ledgerPath, readAcks(t, ackPath), n)
				require.NoError(t, e.Close())
				boltkit.Check(t, path)
				if t.Failed() {
					t.Fatalf("round %d failed", round)
				}
			}
			t.Logf("%s: %d power cuts; unsynced writes %d, dropped %d, torn %d; %d writes replayed from the journal",
				at.name, rounds(3), st.writes, st.dropped, st.torn, replayed)
		})
	}
}
