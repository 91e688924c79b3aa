package bench

import (
	"maps"
	"testing"
)

// TestParseStrace counts a log of strace -f -y as the flush count reads it:
// fsync and fdatasync per file (finished, or unfinished and resumed: once),
// digits folded; writes only to files opened O_DSYNC or O_SYNC (already
// open, or opened in the log); msync only with MS_SYNC; other calls not.
func TestParseStrace(t *testing.T) {
	const log = `101 fdatasync(3</d/store/idem.db>) = 0
102 fdatasync(7</d/store/idem.db-journal-0001> <unfinished ...>
101 write(3</d/store/idem.db>, "x", 1) = 1
102 <... fdatasync resumed>) = 0
103 fsync(8</d/store/idem.db-journal-0002>) = 0
101 pwrite64(9</d/store/dsync.log>, "x"..., 256, 0) = 256
101 openat(AT_FDCWD</d>, "/d/store/sync.log", O_RDWR|O_CREAT|O_SYNC|O_CLOEXEC, 0600) = 10</d/store/sync.log>
101 write(10</d/store/sync.log>, "y", 1) = 1
101 msync(0x7f0000000000, 4096, MS_ASYNC) = 0
101 msync(0x7f0000000000, 4096, MS_SYNC) = 0
101 fdatasync(4</tmp/elsewhere.db>) = 0
101 futex(0x1, FUTEX_WAKE, 1) = 0
101 +++ exited with 0 +++
`
	c := parseStrace(log, "/d/store", map[string]bool{"/d/store/dsync.log": true})
	want := map[string]int{"idem.db": 1, "idem.db-journal-#": 2, "/tmp/elsewhere.db": 1}
	if !maps.Equal(c.perFile, want) {
		t.Errorf("per file %v, want %v", c.perFile, want)
	}
	wantOther := map[string]int{"O_DSYNC write dsync.log": 1, "O_DSYNC write sync.log": 1, "msync": 1}
	if !maps.Equal(c.other, wantOther) {
		t.Errorf("other flushes %v, want %v", c.other, wantOther)
	}
	c.Ops = 2
	r := c.result(syncsSpec{})
	if c.total() != 7 || r.Score != 3.5 || r.ScoreUnit != "syncs/call" {
		t.Errorf("total %d, score %v %s; want 7 flushes, 3.5 syncs/call (the others count)", c.total(), r.Score, r.ScoreUnit)
	}
	if m, _ := r.Metric("syncs/call:idem.db-journal-#"); m != 1 {
		t.Errorf("journal's share %v, want 1", m)
	}
}
