package robustness

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCutModes checks the FUSE layer's power cuts themselves, on a file of
// 4 synced sectors ('s') and three unsynced writes through the mount: A
// (sectors 0-1, 'a'), B (sectors 2-3, 'b'), C (bytes 700 to 1100, 'c', across a
// sector boundary). Over fixed seeds: the synced bytes survive every cut;
// every sector holds what the last kept piece of a write left there, whole
// (never a sector mixing two versions but where C starts or ends inside
// it, its own bytes); the ordered cuts keep a prefix of the writes, whole;
// the harsh cut, over the seeds, keeps a later write while dropping an
// earlier one, and tears a write (some of its sectors kept, others not).
func TestCutModes(t *testing.T) {
	type write struct {
		off int64
		n   int
		b   byte
	}
	writes := []write{{0, 1024, 'a'}, {1024, 1024, 'b'}, {700, 400, 'c'}}
	// want: the file when the writes kept are keep[i] (per write, per
	// sector it covers: kept or not).
	build := func(keep [][]bool) []byte {
		f := bytes.Repeat([]byte{'s'}, 4*sector)
		for i, w := range writes {
			for off := w.off; off < w.off+int64(w.n); {
				next := min((off/sector+1)*sector, w.off+int64(w.n))
				if keep[i][off/sector-w.off/sector] {
					copy(f[off:next], bytes.Repeat([]byte{w.b}, int(next-off)))
				}
				off = next
			}
		}
		return f
	}
	sectors := func(w write) int { return int((w.off+int64(w.n)-1)/sector - w.off/sector + 1) }
	// outcomes: every combination of sectors kept, by the file it gives.
	outcomes := map[string][][]bool{}
	var walk func(i int, keep [][]bool)
	walk = func(i int, keep [][]bool) {
		if i == len(writes) {
			outcomes[string(build(keep))] = append([][]bool(nil), keep...)
			return
		}
		n := sectors(writes[i])
		for mask := range 1 << n {
			k := make([]bool, n)
			for j := range n {
				k[j] = mask&(1<<j) != 0
			}
			walk(i+1, append(keep, k))
		}
	}
	walk(0, nil)

	for _, c := range []cut{cutAll, cutSuffix, cutHarsh} {
		t.Run(c.String(), func(t *testing.T) {
			outOfOrder, torn := 0, 0
			for s := range uint64(24) {
				f := mountFaultFS(t)
				path := filepath.Join(f.mnt, "f")
				require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte{'s'}, 4*sector), 0o644))
				file, err := os.OpenFile(path, os.O_RDWR, 0)
				require.NoError(t, err)
				require.NoError(t, file.Sync())
				for _, w := range writes {
					_, err := file.WriteAt(bytes.Repeat([]byte{w.b}, w.n), w.off)
					require.NoError(t, err)
				}
				require.NoError(t, file.Close())
				f.powerCut(t, rand.New(rand.NewPCG(s, 7)), c)
				got, err := os.ReadFile(filepath.Join(f.under, "f"))
				require.NoError(t, err)
				_, ok := outcomes[string(got)]
				require.True(t, ok, "seed %d: the file after the cut is no combination of whole sectors of the writes: %q", s, got)
				// A's and B's sectors, each where C does not cover it:
				// per write -1 dropped, 1 kept, 0 torn.
				whole := make([]int, 2)
				for i, regions := range [][][2]int{{{0, 512}, {512, 700}}, {{1100, 1536}, {1536, 2048}}} {
					n := 0
					for _, r := range regions {
						if got[r[0]] == writes[i].b {
							n++
						}
					}
					whole[i] = map[int]int{0: -1, 1: 0, 2: 1}[n]
				}
				// A later write kept over an earlier one dropped (B's
				// sectors are its own; A's first sector is A's only).
				if whole[0] == -1 && whole[1] == 1 {
					outOfOrder++
				}
				if whole[0] == 0 || whole[1] == 0 {
					torn++
				}
				if c != cutHarsh {
					require.False(t, whole[0] == -1 && whole[1] != -1, "seed %d: an ordered cut kept B without A", s)
					require.False(t, whole[0] == 0 || whole[1] == 0, "seed %d: an ordered cut tore a write", s)
				}
			}
			t.Logf("%s: of 24 cuts, %d kept B and dropped A, %d tore A or B", c, outOfOrder, torn)
			if c == cutHarsh {
				require.Positive(t, outOfOrder, "the harsh cut never kept a later write without an earlier one")
				require.Positive(t, torn, "the harsh cut never tore a write at a sector")
			}
		})
	}
}
