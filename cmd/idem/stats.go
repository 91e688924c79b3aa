package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
)

func newStatsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Count the records by state and show the file's size",
		Long: `stats counts the records by state: started (interrupted executions, since no
program holds the file), done, expired but not yet pruned, and corrupt (see
idem check). Expiry follows --retention and --recovery.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return a.stats() },
	}
}

type statsJSON struct {
	Path      string `json:"path"`
	FileSize  int64  `json:"file_size"`
	Retention string `json:"retention"`
	Records   struct {
		Live           int `json:"live"`
		Started        int `json:"started"`
		Done           int `json:"done"`
		ExpiredPending int `json:"expired_pending"`
		Corrupt        int `json:"corrupt"`
	} `json:"records"`
}

func (a *app) stats() error {
	s, err := a.engineStats()
	if err != nil {
		return err
	}
	// The size on disk, which is what compact shrinks (Stats.FileSize is
	// the size bbolt maps, up to the last page in use).
	size, err := fileSize(a.db)
	if err != nil {
		return err
	}
	s.FileSize = size
	out := statsJSON{Path: a.db, FileSize: s.FileSize, Retention: a.retention.String()}
	out.Records.Live = s.Started + s.Done
	out.Records.Started, out.Records.Done = s.Started, s.Done
	out.Records.ExpiredPending, out.Records.Corrupt = s.ExpiredPending, s.Corrupt
	if a.json {
		return a.printJSON(out)
	}
	w := a.table()
	fmt.Fprintf(w, "file\t%s (%s)\n", a.db, fmtBytes(s.FileSize))
	fmt.Fprintf(w, "records\t%d live: %d started, %d done\n", out.Records.Live, s.Started, s.Done)
	fmt.Fprintf(w, "expired\t%d awaiting prune (retention %v)\n", s.ExpiredPending, a.retention)
	corrupt := fmt.Sprint(s.Corrupt)
	if s.Corrupt > 0 {
		corrupt += " (run idem check)"
	}
	fmt.Fprintf(w, "corrupt\t%s\n", corrupt)
	return w.Flush()
}

func (a *app) engineStats() (s idem.Stats, err error) {
	e, err := a.openEngine()
	if err != nil {
		return s, err
	}
	defer closeEngine(e, &err)
	return e.Stats()
}
