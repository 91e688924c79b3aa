package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

// maxPageErrors bounds the page-level errors kept for the report.
const maxPageErrors = 100

func newCheckCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Check the file: bbolt's consistency check, then decode every record",
		Long: `check runs bbolt's consistency check on the file (read-only), then decodes every
record and names the keys of the corrupt ones. It exits with status 1 if it
finds any problem. A file with page-level damage is not opened for writing, and
its records are not decoded: restore it from a backup.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return a.check() },
	}
}

type checkJSON struct {
	Path string `json:"path"`
	OK   bool   `json:"ok"`
	// Pages is bbolt's consistency check: its errors, at most 100 of them.
	Pages struct {
		OK     bool     `json:"ok"`
		Errors []string `json:"errors"`
		Total  int      `json:"total_errors"`
	} `json:"pages"`
	// Records is the decoding of every record; Checked is false when the
	// page check failed and the records were not read.
	Records struct {
		Checked        bool          `json:"checked"`
		Decoded        int           `json:"decoded"`
		Started        int           `json:"started"`
		Done           int           `json:"done"`
		ExpiredPending int           `json:"expired_pending"`
		Corrupt        []corruptJSON `json:"corrupt"`
		// CorruptMessages counts outbox messages and dead letters that fail
		// to decode (idem outbox ls names them).
		CorruptMessages int `json:"corrupt_messages"`
	} `json:"records"`
	// Journal is the write-ahead journal beside the file (<path>.journal/):
	// OK when its frames after the checkpoint read back in order (a torn
	// tail is no damage), Pending the writes they hold that the file does
	// not yet (the next writable open replays them), Error the damage
	// found. Checked is false when the records were not read.
	Journal struct {
		Checked bool   `json:"checked"`
		OK      bool   `json:"ok"`
		Pending uint64 `json:"pending_writes"`
		Error   string `json:"error,omitempty"`
	} `json:"journal"`
}

type corruptJSON struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

func (a *app) check() error {
	out := checkJSON{Path: a.db}
	out.Pages.Errors = []string{}
	out.Records.Corrupt = []corruptJSON{}
	if err := checkPages(a.db, &out); err != nil {
		return err
	}
	if out.Pages.OK {
		if err := a.checkRecords(&out); err != nil {
			return err
		}
	}
	out.OK = out.Pages.OK && out.Journal.OK && len(out.Records.Corrupt) == 0 && out.Records.CorruptMessages == 0
	if a.json {
		if err := a.printJSON(out); err != nil {
			return err
		}
	} else if err := a.printCheck(&out); err != nil {
		return err
	}
	if !out.OK {
		return &exitError{code: 1}
	}
	return nil
}

// checkPages runs bbolt's Tx.Check on the file opened read-only, after its
// meta pages were found to fit the file (a file bbolt cannot map safely is
// reported as one page-level error, and not opened).
func checkPages(path string, out *checkJSON) error {
	var damaged *damagedError
	if err := mustExist(path); err != nil {
		return err
	}
	if err := checkFile(path); errors.As(err, &damaged) {
		out.Pages.Total = 1
		out.Pages.Errors = append(out.Pages.Errors, damaged.err.Error())
		return nil
	}
	db, err := openReadOnly(path)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			out.Pages.Total++
			if len(out.Pages.Errors) < maxPageErrors {
				out.Pages.Errors = append(out.Pages.Errors, err.Error())
			}
		}
		// Healthy pages of a file that is not ours: checkRecords' open of
		// the engine says so, like every other command.
		out.Pages.OK = out.Pages.Total == 0
		return nil
	})
}

// checkRecords decodes every record through the engine, whose open reads
// the journal back (and refuses a damaged one with ErrCorrupt).
func (a *app) checkRecords(out *checkJSON) (err error) {
	out.Journal.Checked = true
	e, err := a.openEngine()
	if errors.Is(err, idem.ErrCorrupt) && strings.Contains(err.Error(), "journal") {
		out.Journal.Error = err.Error()
		return nil
	}
	if err != nil {
		return err
	}
	out.Journal.OK = true
	out.Journal.Pending = e.Stats().Replayed
	defer closeEngine(e, &err)
	defer func() {
		// Decoding never panics; bbolt may, on damage its check missed.
		if p := recover(); p != nil {
			out.Records.Corrupt = append(out.Records.Corrupt, corruptJSON{Key: "", Error: fmt.Sprintf("panic while reading records: %v", p)})
		}
	}()
	out.Records.Checked = true
	err = e.Records(func(r *idem.Record, rerr error) error {
		var op *idem.OpError
		switch {
		case rerr == nil:
			out.Records.Decoded++
			if r.State == idem.StateStarted {
				out.Records.Started++
			} else {
				out.Records.Done++
			}
		case errors.Is(rerr, idem.ErrCorrupt) && errors.As(rerr, &op):
			out.Records.Corrupt = append(out.Records.Corrupt, corruptJSON{Key: op.Key, Error: op.Err.Error()})
		default:
			return rerr
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.SortFunc(out.Records.Corrupt, func(x, y corruptJSON) int { return strings.Compare(x.Key, y.Key) })
	s, err := e.ScanFile()
	if err != nil {
		return err
	}
	out.Records.ExpiredPending = s.ExpiredPending
	out.Records.Decoded += s.ExpiredPending
	out.Records.CorruptMessages = s.Outbox.Corrupt
	return nil
}

func (a *app) printCheck(out *checkJSON) error {
	w := a.table()
	if out.Pages.OK {
		fmt.Fprintf(w, "pages\tok (bbolt consistency check)\n")
	} else {
		fmt.Fprintf(w, "pages\t%s\n", plural(out.Pages.Total, "error", "errors"))
		for _, e := range out.Pages.Errors {
			fmt.Fprintf(w, "\t  %s\n", e)
		}
		if out.Pages.Total > len(out.Pages.Errors) {
			fmt.Fprintf(w, "\t  ... and %d more\n", out.Pages.Total-len(out.Pages.Errors))
		}
	}
	switch j := &out.Journal; {
	case !j.Checked:
	case !j.OK:
		fmt.Fprintf(w, "journal\tdamaged: %s\n", j.Error)
	default:
		fmt.Fprintf(w, "journal\tok: %s not yet in the file (the next writable open replays them)\n", plural(int(j.Pending), "write", "writes"))
	}
	if out.Records.Checked {
		r := &out.Records
		fmt.Fprintf(w, "records\t%d decoded: %d started, %d done, %d expired awaiting prune\n",
			r.Decoded, r.Started, r.Done, r.ExpiredPending)
		fmt.Fprintf(w, "corrupt\t%d\n", len(r.Corrupt))
		for _, c := range r.Corrupt {
			fmt.Fprintf(w, "\t  %s: %s\n", quoteKey(c.Key), c.Error)
		}
		fmt.Fprintf(w, "outbox\t%d corrupt messages (idem outbox ls names them)\n", r.CorruptMessages)
	} else if !out.Pages.OK {
		fmt.Fprintf(w, "records\tnot checked: the file has page-level damage; restore it from a backup\n")
	} else {
		fmt.Fprintf(w, "records\tnot checked: the journal is damaged; restore from a backup\n")
	}
	if err := w.Flush(); err != nil {
		return err
	}
	switch {
	case out.OK:
		fmt.Fprintf(a.stdout, "ok: %s\n", a.db)
	case !out.Pages.OK:
		fmt.Fprintf(a.stdout, "FAILED: %s has %s\n", a.db, plural(out.Pages.Total, "page-level error", "page-level errors"))
	case !out.Journal.OK:
		fmt.Fprintf(a.stdout, "FAILED: %s has a damaged journal\n", a.db)
	case len(out.Records.Corrupt) > 0:
		fmt.Fprintf(a.stdout, "FAILED: %s has %s\n", a.db, plural(len(out.Records.Corrupt), "corrupt record", "corrupt records"))
	default:
		fmt.Fprintf(a.stdout, "FAILED: %s has %s\n", a.db, plural(out.Records.CorruptMessages, "corrupt outbox message", "corrupt outbox messages"))
	}
	return nil
}
