package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
)

func newStatsCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "stats",
		Short: "Count the records and outbox messages by state and show the file's size",
		Long: `stats counts the records by state: started (interrupted executions, since no
program holds the file), done, expired but not yet pruned, and corrupt (see
idem check). Expiry follows each record's own retention window and recovery
policy, recorded in the file (--retention and --recovery refuse only lengthen).

It counts the outbox messages too: pending (not delivered yet; retrying are
those that failed at least once), dead letters inside their retention
(each one's own, recorded in the file; --dead-letter-retention only lengthens
it), and corrupt ones
(see idem outbox ls). Whether a pending message's topic has a handler is
known to the program only: the tool registers none.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return a.stats() },
	}
	c.Flags().DurationVar(&a.deadLetterRetention, "dead-letter-retention", 0, deadLetterRetentionUsage)
	return c
}

type statsJSON struct {
	Path     string `json:"path"`
	FileSize int64  `json:"file_size"`
	// Retention is --retention: "recorded" when each record's own window
	// decides (the default).
	Retention string `json:"retention"`
	Records   struct {
		Live           int `json:"live"`
		Started        int `json:"started"`
		Done           int `json:"done"`
		ExpiredPending int `json:"expired_pending"`
		Corrupt        int `json:"corrupt"`
	} `json:"records"`
	// Outbox counts the outbox messages; Retrying are among Pending.
	Outbox struct {
		Pending  int `json:"pending"`
		Retrying int `json:"retrying"`
		Dead     int `json:"dead"`
		Corrupt  int `json:"corrupt"`
	} `json:"outbox"`
}

func (a *app) stats() error {
	if err := a.checkDeadLetterRetention(); err != nil {
		return err
	}
	s, err := a.engineStats()
	if err != nil {
		return err
	}
	// The size on disk, which is what compact shrinks (FileStats.FileSize is
	// the size bbolt maps, up to the last page in use).
	size, err := a.sizeOf(s)
	if err != nil {
		return err
	}
	s.FileSize = size
	out := statsJSON{Path: a.db, FileSize: s.FileSize, Retention: "recorded"}
	if a.retention > 0 {
		out.Retention = a.retention.String()
	}
	out.Records.Live = s.Started + s.Done
	out.Records.Started, out.Records.Done = s.Started, s.Done
	out.Records.ExpiredPending, out.Records.Corrupt = s.ExpiredPending, s.Corrupt
	// Not Waiting: the tool registers no handler, so every pending message
	// would count. Not Delivered: it counts since Open.
	out.Outbox.Pending, out.Outbox.Retrying = s.Outbox.Pending, s.Outbox.Retrying
	out.Outbox.Dead, out.Outbox.Corrupt = s.Outbox.Dead, s.Outbox.Corrupt
	if a.json {
		return a.printJSON(out)
	}
	w := a.table()
	fmt.Fprintf(w, "file\t%s (%s)\n", a.db, fmtBytes(s.FileSize))
	fmt.Fprintf(w, "records\t%d live: %d started, %d done\n", out.Records.Live, s.Started, s.Done)
	fmt.Fprintf(w, "expired\t%d awaiting prune (%s)\n", s.ExpiredPending, a.retentionNote())
	corrupt := fmt.Sprint(s.Corrupt)
	if s.Corrupt > 0 {
		corrupt += " (run idem check)"
	}
	fmt.Fprintf(w, "corrupt\t%s\n", corrupt)
	ob := out.Outbox
	fmt.Fprintf(w, "outbox\t%d pending (%d retrying), %s, %d corrupt\n",
		ob.Pending, ob.Retrying, plural(ob.Dead, "dead letter", "dead letters"), ob.Corrupt)
	return w.Flush()
}

func (a *app) engineStats() (s idem.FileStats, err error) {
	e, err := a.openOperator()
	if err != nil {
		return s, err
	}
	defer closeEngine(e, &err)
	return e.ScanFile()
}
