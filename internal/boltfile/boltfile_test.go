package boltfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// healthy returns the bytes of a small healthy bbolt file.
func healthy(t testing.TB) []byte {
	path := filepath.Join(t.TempDir(), "b.db")
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte("b"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), bytes.Repeat([]byte("v"), 20000))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCheckMeta(t *testing.T) {
	good := healthy(t)
	ps, fl := pageSizeAndFreelist(good)
	longFreelist := append([]byte(nil), good...)
	binary.NativeEndian.PutUint16(longFreelist[fl*ps+10:], 0xFFFF) // the count is in the first element
	binary.NativeEndian.PutUint64(longFreelist[fl*ps+16:], 1<<40)  // a count far past the page
	shortFreelist := append([]byte(nil), good...)
	binary.NativeEndian.PutUint32(shortFreelist[fl*ps+12:], 1<<20) // overflow pages past the end
	torn := append([]byte(nil), good...)
	torn[16+20] ^= 0xff // page 0's checksum fails: bbolt falls back to page 1
	for _, tc := range []struct {
		name string
		b    []byte
		want error // nil: passes
	}{
		{"healthy", good, nil},
		{"empty: bbolt initialises it", nil, nil},
		{"page 0 torn", torn, nil},
		{"truncated to 8 KiB", good[:8<<10], ErrDamaged},
		{"freelist count past its page", longFreelist, ErrDamaged},
		{"freelist overflow past the pages in use", shortFreelist, ErrDamaged},
		{"truncated inside page 1", good[:4096+40], ErrDamaged},
		{"truncated inside page 0", good[:50], bolterrors.ErrInvalid},
		{"not a bbolt file", bytes.Repeat([]byte("x"), 20000), bolterrors.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckMeta(bytes.NewReader(tc.b), int64(len(tc.b)))
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("CheckMeta: %v, want %v", err, tc.want)
			}
		})
	}
}

// pageSizeAndFreelist reads the page size and the freelist page of the meta
// page of the higher txid.
func pageSizeAndFreelist(b []byte) (ps, freelist uint64) {
	ne := binary.NativeEndian
	ps = uint64(ne.Uint32(b[16+8:]))
	m := b[16:]
	if m1 := b[ps+16:]; ne.Uint64(m1[48:]) > ne.Uint64(m[48:]) {
		m = m1
	}
	return ps, ne.Uint64(m[32:])
}

// CheckMeta reads untrusted bytes: it must never panic, and what it passes
// must be a file whose meta pages fit in it.
func FuzzCheckMeta(f *testing.F) {
	good := healthy(f)
	f.Add(good[:8<<10], int64(len(good)))
	f.Add(good[:8<<10], int64(8<<10))
	f.Add([]byte{}, int64(0))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		if size < 0 || size > 1<<40 {
			return
		}
		_ = CheckMeta(bytes.NewReader(b), size) // a reader shorter than size reads EOF
	})
}
