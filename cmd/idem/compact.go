package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/spf13/cobra"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

// defaultTxMaxSize is the bytes copied per write transaction of compact, as in
// the bbolt tool.
const defaultTxMaxSize = 65536

func newCompactCmd(a *app) *cobra.Command {
	var txMaxSize int64
	c := &cobra.Command{
		Use:   "compact SRC DST",
		Short: "Rewrite SRC into a new, compacted file DST",
		Long: `compact copies every bucket and key of SRC into a new file DST (bbolt's
Compact), leaving out the free pages: an idem file never shrinks by itself.
SRC is opened read-only and must not be held by a program; DST must not exist.
Afterwards, with no program holding the files, replace SRC with DST.
--db is not used.`,
		Args: cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error { return a.compact(args[0], args[1], txMaxSize) },
	}
	c.Flags().Int64Var(&txMaxSize, "tx-max-size", defaultTxMaxSize, "bytes copied per write transaction (0: one transaction)")
	return c
}

type compactJSON struct {
	Src     string `json:"src"`
	Dst     string `json:"dst"`
	SrcSize int64  `json:"src_size"`
	DstSize int64  `json:"dst_size"`
}

func (a *app) compact(src, dst string, txMaxSize int64) (err error) {
	if txMaxSize < 0 {
		return &usageError{errors.New("--tx-max-size must not be negative")}
	}
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("idem: %s exists; compact writes a new file", dst)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("idem: %w", err)
	}
	if err := noPendingJournal(src); err != nil {
		return err
	}
	srcDB, err := openReadOnly(src)
	if err != nil {
		return err
	}
	defer srcDB.Close()
	dstDB, err := bbolt.Open(dst, 0o600, &bbolt.Options{Timeout: lockTimeout})
	if err != nil {
		return openError(dst, err)
	}
	err = bbolt.Compact(dstDB, srcDB, txMaxSize)
	if cerr := dstDB.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(dst)
		return fmt.Errorf("idem: compact %s: %w", src, err)
	}
	out := compactJSON{Src: src, Dst: dst}
	if out.SrcSize, err = fileSize(src); err != nil {
		return err
	}
	if out.DstSize, err = fileSize(dst); err != nil {
		return err
	}
	if a.json {
		return a.printJSON(out)
	}
	_, err = fmt.Fprintf(a.stdout, "compacted %s (%s) into %s (%s): %s\n",
		src, fmtBytes(out.SrcSize), dst, fmtBytes(out.DstSize), shrink(out.SrcSize, out.DstSize))
	return err
}

// shrink says how much smaller dst is than src, in whole percent rounded
// down, so that a file that kept any bytes is never "100% smaller".
func shrink(src, dst int64) string {
	if dst >= src || src <= 0 {
		return "no smaller"
	}
	pct := 100 * (src - dst) / src
	if pct == 0 {
		return "less than 1% smaller"
	}
	return fmt.Sprintf("%d%% smaller", pct)
}

func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("idem: %w", err)
	}
	return fi.Size(), nil
}

// noPendingJournal refuses a file whose journal holds writes the file does
// not yet: bbolt's Compact copies the file alone, and DST would lack them.
// A read-only open of the engine reads the journal back and counts them.
func noPendingJournal(src string) error {
	if err := mustExist(src); err != nil {
		return err
	}
	e, err := idem.OpenFile(src, &idem.BoltOptions{ReadOnly: true, LockTimeout: lockTimeout}, &idem.Options{PruneInterval: -1})
	if err != nil {
		return openError(src, err)
	}
	n := e.Stats().Replayed
	if err := e.Close(); err != nil {
		return fmt.Errorf("idem: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("idem: compact %s: its journal holds %d writes the file does not yet; open it for writing once (`idem prune --db FILE` does: every writable open replays the journal into the file), then compact", src, n)
	}
	return nil
}
