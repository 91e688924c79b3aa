package idem_test

// The conformance suite (idemtest) run on this package's bbolt engine.

import (
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// effectsBucket is the user bucket the suite's effect rows go to.
var effectsBucket = []byte("effects")

// boltHarness opens bbolt engines on files in a test's temporary directory,
// with the write-ahead journal (the default).
var boltHarness = harnessWith(nil)

// harnessWith is boltHarness with the file's settings file.
func harnessWith(file *idem.BoltOptions) idemtest.Harness[*idem.Tx] {
	h := harnessBase
	h.Open = func(t testing.TB, store string, o idemtest.Options) (idemtest.Engine[*idem.Tx], error) {
		return idem.OpenFile(store, file, o.Engine())
	}
	h.OpenWrapped = func(t testing.TB, store string, o idemtest.Options, wrap func(idemcore.Backend[*idem.Tx]) idemcore.Backend[*idem.Tx]) (idemtest.Engine[*idem.Tx], error) {
		return idem.OpenFileWrapped(store, file, o.Engine(), wrap)
	}
	if file != nil && file.JournalSize < 0 {
		h.Unreached = map[string]string{}
		for _, p := range []string{"journal-before-write", "journal-before-sync", "journal-after-sync", "checkpoint-before-commit", "checkpoint-after-commit"} {
			h.Unreached[p] = "the journal is off (BoltOptions.JournalSize < 0); TestConformance runs it"
		}
	} else {
		h.Unreached = map[string]string{}
		for _, p := range []string{"commit-shared-before", "commit-shared-after"} {
			h.Unreached[p] = "with the journal on, DoTx's group commit is the journal's; only the dispatcher's, pruner's and operator's direct writes use the pipeline, and they seldom share a commit: TestConformanceJournalOff runs it"
		}
	}
	return h
}

var harnessBase = idemtest.Harness[*idem.Tx]{
	New: func(t testing.TB) string { return filepath.Join(t.TempDir(), "idem.db") },
	PutEffect: func(tx *idem.Tx, key, value string) error {
		b, err := tx.Bucket(effectsBucket)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), []byte(value))
	},
	Effects: func(e idemtest.Engine[*idem.Tx]) (map[string]string, error) {
		m := map[string]string{}
		err := e.(*idem.Engine).View(func(tx *bbolt.Tx) error {
			b := tx.Bucket(effectsBucket)
			if b == nil {
				return nil
			}
			return b.ForEach(func(k, v []byte) error { m[string(k)] = string(v); return nil })
		})
		return m, err
	},
	Enqueue: func(tx *idem.Tx, topic string, payload []byte) error { return tx.Enqueue(topic, payload) },
	Hook:    idemtest.CoreHook,
	Check:   boltkit.Check,
}

func TestConformance(t *testing.T) {
	// The suite's hooks are failpoints: it runs in the build with them.
	if !testkit.Failpoints(t) {
		return
	}
	idemtest.Run(t, boltHarness)
}

// TestConformanceJournalOff runs the suite with the journal off
// (BoltOptions.JournalSize negative, as NoSync and MaxSize turn it off):
// Do's records and DoTx's writes are bbolt commits of the commit pipeline,
// DoTx's shared among concurrent calls.
func TestConformanceJournalOff(t *testing.T) {
	if !testkit.Failpoints(t) {
		return
	}
	idemtest.Run(t, harnessWith(&idem.BoltOptions{JournalSize: -1}))
}

// The bbolt engine offers every engine's methods.
var _ idemtest.Engine[*idem.Tx] = (*idem.Engine)(nil)

// TestBackend runs the seam suite on the bbolt backend, as OpenWrapped hands
// it to an idle engine.
func TestBackend(t *testing.T) {
	idemtest.RunBackend(t, func(t testing.TB) idemcore.Backend[*idem.Tx] {
		path := filepath.Join(t.TempDir(), "idem.db")
		return idemtest.EngineBackend(t, func(wrap func(idemcore.Backend[*idem.Tx]) idemcore.Backend[*idem.Tx]) (idemtest.Engine[*idem.Tx], error) {
			return idem.OpenWrapped(path, &idem.Options{PruneInterval: -1}, wrap)
		})
	})
}
