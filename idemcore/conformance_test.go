package idemcore_test

// The conformance suite (idemtest.Run) and the seam suite
// (idemtest.RunBackend) on an in-memory backend (internal/memstore): the
// core's tests of its own, free of bbolt and Postgres.

import (
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/memstore"
	"github.com/idemkit/idem/internal/testkit"
)

func TestMain(m *testing.M) {
	idemtest.ChildMain()
	os.Exit(testkit.Main(m, nil))
}

// memStores names the stores of the harness's tests.
var (
	memMu     sync.Mutex
	memStores = map[string]*memstore.Store{}
	memNext   atomic.Int64
	memOf     sync.Map // *idemcore.Engine[*memstore.Tx] → *memstore.Store
)

func memStore(t testing.TB, name string) *memstore.Store {
	t.Helper()
	memMu.Lock()
	defer memMu.Unlock()
	s := memStores[name]
	if s == nil {
		t.Fatalf("no store %q", name)
	}
	return s
}

// memOpen opens an engine on store over its memstore backend, wrapped by wrap.
func memOpen(t testing.TB, store string, o idemtest.Options, wrap func(idemcore.Backend[*memstore.Tx]) idemcore.Backend[*memstore.Tx]) (idemtest.Engine[*memstore.Tx], error) {
	st := memStore(t, store)
	b, err := memstore.Open(st, o.Now)
	if err != nil {
		return nil, err
	}
	var be idemcore.Backend[*memstore.Tx] = b
	if wrap != nil {
		be = wrap(be)
	}
	e, err := idemcore.New(be, *o.Engine())
	if err != nil {
		b.Close()
		return nil, err
	}
	memOf.Store(e, st)
	return e, nil
}

// memHarness runs engines of idemcore.New over memstore backends.
var memHarness = idemtest.Harness[*memstore.Tx]{
	New: func(t testing.TB) string {
		name := "mem-" + strconv.FormatInt(memNext.Add(1), 10)
		memMu.Lock()
		memStores[name] = memstore.NewStore()
		memMu.Unlock()
		t.Cleanup(func() {
			memMu.Lock()
			delete(memStores, name)
			memMu.Unlock()
		})
		return name
	},
	Open: func(t testing.TB, store string, o idemtest.Options) (idemtest.Engine[*memstore.Tx], error) {
		return memOpen(t, store, o, nil)
	},
	OpenWrapped: memOpen,
	PutEffect:   func(tx *memstore.Tx, key, value string) error { return tx.Put(key, value) },
	Effects: func(e idemtest.Engine[*memstore.Tx]) (map[string]string, error) {
		st, _ := memOf.Load(e)
		return st.(*memstore.Store).Effects(), nil
	},
	Enqueue:   func(tx *memstore.Tx, topic string, payload []byte) error { return tx.Enqueue(topic, payload) },
	Hook:      idemtest.CoreHook,
	InProcess: true,
}

func TestConformance(t *testing.T) {
	// The suite's hooks are failpoints: it runs in the build with them.
	if !testkit.Failpoints(t) {
		return
	}
	idemtest.Run(t, memHarness)
}

func TestBackend(t *testing.T) {
	idemtest.RunBackend(t, func(t testing.TB) idemcore.Backend[*memstore.Tx] { return memBackend(t) })
}

// memBackend opens a backend over a fresh store, closed when t ends.
func memBackend(t testing.TB) *memstore.Backend {
	t.Helper()
	b, err := memstore.Open(memstore.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
