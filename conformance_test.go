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

// boltHarness opens bbolt engines on files in a test's temporary directory.
var boltHarness = idemtest.Harness[*idem.Tx]{
	New: func(t testing.TB) string { return filepath.Join(t.TempDir(), "idem.db") },
	Open: func(t testing.TB, store string, o idemtest.Options) (idemtest.Engine[*idem.Tx], error) {
		return idem.Open(store, o.Engine())
	},
	OpenWrapped: func(t testing.TB, store string, o idemtest.Options, wrap func(idemcore.Backend[*idem.Tx]) idemcore.Backend[*idem.Tx]) (idemtest.Engine[*idem.Tx], error) {
		return idem.OpenWrapped(store, o.Engine(), wrap)
	},
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
