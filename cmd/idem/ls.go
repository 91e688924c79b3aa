package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
)

func newLsCmd(a *app) *cobra.Command {
	var state string
	var limit int
	c := &cobra.Command{
		Use:   "ls",
		Short: "List the live records, sorted by key",
		Long: `ls lists the live records (inside their retention window), sorted by key, with
their state, attempt, times, response size and stored error code. Corrupt
records are counted, not listed: run idem check.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return a.ls(state, limit) },
	}
	c.Flags().StringVar(&state, "state", "", "list only records in this state: started or done")
	c.Flags().IntVar(&limit, "limit", 0, "list at most this many records (0: all)")
	return c
}

type lsJSON struct {
	Records []recordJSON `json:"records"`
	// Matched counts the records that pass the filter, listed or not.
	Matched int `json:"matched"`
	// Corrupt counts records that failed to decode (not listed).
	Corrupt int `json:"corrupt"`
}

func (a *app) ls(state string, limit int) (err error) {
	var want idem.State
	if state != "" {
		if want, err = parseState(state); err != nil {
			return &usageError{fmt.Errorf("--state: %w", err)}
		}
	}
	if err := checkLimit(limit); err != nil {
		return err
	}
	e, err := a.openEngine()
	if err != nil {
		return err
	}
	defer closeEngine(e, &err)

	out := lsJSON{Records: []recordJSON{}}
	err = e.Records(func(r *idem.Record, rerr error) error {
		switch {
		case rerr != nil && errors.Is(rerr, idem.ErrCorrupt):
			out.Corrupt++
		case rerr != nil:
			return rerr
		case want == 0 || r.State == want:
			out.Records = append(out.Records, a.recordJSON(r, false))
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.SortFunc(out.Records, func(x, y recordJSON) int { return strings.Compare(x.Key, y.Key) })
	out.Records, out.Matched = firstOf(out.Records, limit)
	if a.json {
		return a.printJSON(out)
	}
	if out.Corrupt > 0 {
		fmt.Fprintf(a.stderr, "idem: %s not listed; run idem check\n", plural(out.Corrupt, "corrupt record", "corrupt records"))
	}
	if out.Matched == 0 {
		what := "records"
		if state != "" {
			what = state + " records"
		}
		fmt.Fprintf(a.stdout, "no %s\n", what)
		return nil
	}
	w := a.table()
	fmt.Fprintln(w, "KEY\tSTATE\tATTEMPT\tSTARTED\tCOMPLETED\tEXPIRES\tRESPONSE\tERROR")
	for _, r := range out.Records {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", quoteKey(r.Key), r.State, r.Attempt,
			fmtTime(&r.StartedAt, "-"), fmtTime(r.CompletedAt, "-"), fmtTime(r.ExpiresAt, "never"),
			fmtSize(r.ResponseSize), fmtErr(r.Error))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(out.Records) < out.Matched {
		fmt.Fprintf(a.stdout, "(%d of %d records; raise --limit for more)\n", len(out.Records), out.Matched)
	}
	return nil
}

// parseState is the inverse of idem.State.String ("started", "done").
func parseState(s string) (idem.State, error) {
	switch s {
	case "started":
		return idem.StateStarted, nil
	case "done":
		return idem.StateDone, nil
	}
	return 0, fmt.Errorf("unknown state %q (want started or done)", s)
}

// checkLimit checks a --limit: 0 (all) or more.
func checkLimit(limit int) error {
	if limit < 0 {
		return &usageError{errors.New("--limit must not be negative")}
	}
	return nil
}

// firstOf returns the first limit elements of list (all of them when limit
// is 0) and how many it held.
func firstOf[T any](list []T, limit int) ([]T, int) {
	if limit > 0 && len(list) > limit {
		return list[:limit], len(list)
	}
	return list, len(list)
}
