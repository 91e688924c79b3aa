package idem

import (
	"context"

	"bytes"
	"errors"
	"go.etcd.io/bbolt"

	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func sampleRecords() []*Record {
	t0 := time.Unix(1_700_000_000, 123456789)
	return []*Record{
		{Key: "started", State: StateStarted, Fingerprint: 42, Attempt: 1, StartedAt: t0, Retention: 24 * time.Hour, KeptUntilResolved: true},
		{Key: "done", State: StateDone, Fingerprint: 1<<64 - 1, Attempt: 3, StartedAt: t0, CompletedAt: t0.Add(time.Second), Response: []byte(`{"order":"ord_1"}`), Retention: 7 * 24 * time.Hour},
		{Key: "empty", State: StateDone, Attempt: 1, StartedAt: t0, CompletedAt: t0, Response: []byte{}},
		{Key: "error", State: StateDone, Attempt: 1, StartedAt: t0, CompletedAt: t0, Err: &Error{Code: "card_declined", Message: "declined", Replayed: true}},
		{Key: "both", State: StateDone, Attempt: 1, StartedAt: t0, CompletedAt: t0, Response: []byte("partial"), Err: &Error{Message: "half", Replayed: true}},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		t.Run(r.Key, func(t *testing.T) {
			b := encodeRecord(nil, r)
			require.Len(t, b, encodedSize(r))
			got, err := decodeRecord(r.Key, b)
			require.NoError(t, err)
			require.Equal(t, r.Response == nil, got.Response == nil, "nil and empty differ")
			require.True(t, r.StartedAt.Equal(got.StartedAt))
			require.True(t, r.CompletedAt.Equal(got.CompletedAt))
			got.StartedAt, got.CompletedAt = r.StartedAt, r.CompletedAt
			require.Equal(t, r, got)
		})
	}
}

func TestDecodeDamagedRecords(t *testing.T) {
	good := encodeRecord(nil, sampleRecords()[1])
	future := bytes.Clone(good)
	future[0] = recordVersion + 1
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"nil", nil, "too short"},
		{"truncated", good[:len(good)-5], "checksum"},
		{"truncated to the header", good[:recordFixed], "too short"},
		{"one bit flipped", flipped, "checksum"},
		{"future format version", future, "unknown record version"},
		{"garbage", []byte(strings.Repeat("\xff", 64)), "unknown record version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeRecord("order-7f3a", tc.b)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Contains(t, err.Error(), "order-7f3a", "the error names the key")
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// testdata/record-v1-done.bin is a record written by format version 1: it
// must keep decoding to the same record in every later version.
func TestDecodeStoredVersion1(t *testing.T) {
	const path = "testdata/record-v1-done.bin"
	want := sampleRecords()[1] // never rewrite the file: it is what version 1 wrote
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	got, err := decodeRecord("done", b)
	require.NoError(t, err)
	require.Equal(t, want.Response, got.Response)
	require.Equal(t, want.Attempt, got.Attempt)
	require.Equal(t, want.Fingerprint, got.Fingerprint)
	require.True(t, want.CompletedAt.Equal(got.CompletedAt))
	require.Zero(t, got.Retention, "version 1 has no window in the record: the store gives it its slot's")

	up, err := decodeRecord("done", upgradeRecord([]byte("done"), b, 5*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 5*time.Hour, up.Retention, "upgraded with its slot's width")
	require.Equal(t, want.Response, up.Response)
	l, ok := peekLife(b, 5*time.Hour)
	require.True(t, ok)
	require.Equal(t, 5*time.Hour, l.Retention)
	require.False(t, l.KeptUntilResolved)
}

func TestCorruptStoredRecordIsReportedNotPanicked(t *testing.T) {
	path := t.TempDir() + "/idem.db"
	e, err := Open(path, nil)
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, e.b.write(func(tx *bbolt.Tx) error {
		slot := slotAt(e.c.Now(), e.b.st.width)
		e.b.st.addSlot(slot)
		b, err := rootBucket(tx).CreateBucketIfNotExists(slot.Name())
		if err != nil {
			return err
		}
		return b.Put([]byte("order-7f3a"), []byte("not a record"))
	}))
	_, err = e.Do(t.Context(), "order-7f3a", nil, func(context.Context) ([]byte, error) {
		t.Error("fn must not run over a corrupt record")
		return nil, nil
	})
	require.ErrorIs(t, err, ErrCorrupt)
	require.Contains(t, err.Error(), "order-7f3a")
	_, err = e.Get("order-7f3a")
	require.ErrorIs(t, err, ErrCorrupt)
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, st.Corrupt)
	// Forget clears it; the key works again.
	require.NoError(t, e.Forget("order-7f3a"))
	_, err = e.Do(t.Context(), "order-7f3a", nil, func(context.Context) ([]byte, error) { return nil, nil })
	require.NoError(t, err)
}

func FuzzDecodeRecord(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(encodeRecord(nil, r))
	}
	f.Add([]byte{})
	if v1, err := os.ReadFile("testdata/record-v1-done.bin"); err == nil {
		f.Add(v1)
	}
	f.Add([]byte{recordVersion, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord("k", b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		// What the pruner peeks agrees with the decoding.
		l, ok := peekLife(b, time.Hour)
		if !ok || l.State != r.State || l.KeptUntilResolved != r.KeptUntilResolved ||
			(b[0] == recordVersion && l.Retention != r.Retention) || !l.CompletedAt.Equal(r.CompletedAt) || !l.StartedAt.Equal(r.StartedAt) {
			t.Fatalf("peekLife %+v, %v disagrees with decodeRecord %+v", l, ok, r)
		}
		if b[0] == recordVersionV1 {
			return // re-encoded as version 2
		}
		// Whatever decodes re-encodes to the same bytes.
		if again := encodeRecord(nil, r); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", b, again)
		}
	})
}

// A damaged header must not pass for another fingerprint: the fast path
// checks the checksum before it compares.
func TestDamagedFingerprintIsCorruptNotAConflict(t *testing.T) {
	// No replay cache: the damage is made behind the engine's back.
	e, err := Open(t.TempDir()+"/idem.db", &Options{ReplayCacheBytes: -1})
	require.NoError(t, err)
	defer e.Close()
	ctx := t.Context()
	_, err = e.Do(ctx, "k", []byte("args"), func(context.Context) ([]byte, error) { return []byte("v"), nil })
	require.NoError(t, err)
	require.NoError(t, e.b.write(func(tx *bbolt.Tx) error {
		for _, slot := range e.b.st.knownSlots() {
			if b := rootBucket(tx).Bucket(slot.Name()); b != nil && b.Get([]byte("k")) != nil {
				v := bytes.Clone(b.Get([]byte("k")))
				v[5] ^= 0x01 // a bit of the stored fingerprint
				return b.Put([]byte("k"), v)
			}
		}
		return errors.New("record not found")
	}))
	for _, fp := range []string{"args", "other args"} {
		_, err = e.Do(ctx, "k", []byte(fp), func(context.Context) ([]byte, error) {
			t.Error("fn ran over a damaged record")
			return nil, nil
		})
		require.ErrorIs(t, err, ErrCorrupt, "fingerprint %q", fp)
		require.NotErrorIs(t, err, ErrFingerprintMismatch)
	}
}

// A value stored under a slot's name (by a DoTx fn that reached the engine's
// bucket through bbolt) is skipped, not dereferenced.
// TestStrayValueUnderASlotNameIsSkipped: a value (not a bucket) under a slot
// bucket's name, long expired, is neither counted nor pruned nor fatal; the
// records around it are counted and pruned as usual.
func TestStrayValueUnderASlotNameIsSkipped(t *testing.T) {
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	e, err := Open(t.TempDir()+"/idem.db", &Options{PruneInterval: -1, Retention: time.Minute, Now: func() time.Time { return now }})
	require.NoError(t, err)
	defer e.Close()
	_, err = e.Do(t.Context(), "k", nil, func(context.Context) ([]byte, error) { return []byte("v"), nil })
	require.NoError(t, err)
	stray := timeSlot{Start: 1, End: 2}.Name() // 1970: expired long ago
	require.NoError(t, e.b.write(func(tx *bbolt.Tx) error {
		return rootBucket(tx).Put(stray, []byte("not a bucket"))
	}))

	s, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, s.Done)
	require.Zero(t, s.Started+s.ExpiredPending+s.Corrupt, "the stray value is not a record")
	n, err := e.Prune(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "nothing expired: the stray value is not pruned")

	now = now.Add(time.Hour)
	n, err = e.Prune(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n, "k's slot is pruned; the stray value is not counted")
	require.NoError(t, e.b.db.View(func(tx *bbolt.Tx) error {
		require.Equal(t, "not a bucket", string(rootBucket(tx).Get(stray)), "the stray value is left alone")
		return nil
	}))
}
