package main

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// journalFrame is a frame of the engine's journal (frame.go documents the
// format, which this test writes by hand, as a damaged disk would leave it):
// length, CRC-32C seeded with the journal's salt, sequence, payload, padding.
func journalFrame(salt uint32, seq uint64, payload []byte) []byte {
	var h [12]byte
	binary.LittleEndian.PutUint64(h[:8], seq)
	binary.LittleEndian.PutUint32(h[8:], uint32(len(payload)))
	tab := crc32.MakeTable(crc32.Castagnoli)
	crc := crc32.Update(crc32.Update(salt, tab, h[:]), tab, payload)
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
	b = binary.LittleEndian.AppendUint32(b, crc)
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = append(b, payload...)
	for len(b)%8 != 0 {
		b = append(b, 0)
	}
	return b
}

// journalMeta reads the file's journal id and checkpoint.
func journalMeta(t *testing.T, path string) (id, ckpt uint64) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		v := tx.Bucket([]byte("idem")).Bucket([]byte("meta")).Get([]byte("journal"))
		require.Len(t, v, 16)
		id, ckpt = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
		return nil
	}))
	return id, ckpt
}

// TestCheckJournal: a file closed cleanly has no journal to replay (check
// says so); a journal whose frame after the checkpoint is damaged while a
// later one is durable fails the check, and compact refuses nothing it
// cannot read.
func TestCheckJournal(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	r := idemDB(t, path, "check")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stdout, "journal  ok: 0 writes not yet in the file")
	c := decode[checkJSON](t, idemDB(t, path, "--json", "check").stdout)
	require.True(t, c.Journal.Checked)
	require.True(t, c.Journal.OK)
	require.Zero(t, c.Journal.Pending)

	id, ckpt := journalMeta(t, path)
	salt := uint32(id) ^ uint32(id>>32)
	payload := []byte{1, 2, 'b', 'k', 1, 'k', 0} // one put, as frame.go encodes it
	seg := append(journalFrame(salt, ckpt+1, payload), journalFrame(salt, ckpt+2, payload)...)
	seg[20] ^= 0xff // frame ckpt+1's payload: damage, since ckpt+2 is durable behind it
	seg = append(seg, make([]byte, 4096-len(seg))...)
	dir := path + ".journal"
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "00000001"), seg, 0o600))

	r = idemDB(t, path, "check")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stdout, "journal  damaged: ")
	require.Contains(t, r.stdout, "is missing or damaged, but frame")
	require.Regexp(t, `FAILED: \S+idem\.db has a damaged journal\n$`, r.stdout)
	c = decode[checkJSON](t, idemDB(t, path, "--json", "check").stdout)
	require.False(t, c.OK)
	require.False(t, c.Journal.OK)
	require.NotEmpty(t, c.Journal.Error)

	r = idemCmd(t, nil, "", "compact", path, filepath.Join(t.TempDir(), "c.db"))
	require.Equal(t, 1, r.code, "a damaged journal is not compacted away")
	require.Contains(t, r.stderr, "corrupt")
}
