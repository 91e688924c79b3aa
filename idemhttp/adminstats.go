package idemhttp

import (
	"net/http"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// The admin handler's counts: GET /stats.

func (a *admin) stats(w http.ResponseWriter, _ *http.Request) error {
	fs, err := a.scan()
	if err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, newAdminStats(fs, a.op.Stats(), a.op.Retention()))
}

// AdminStats is the answer of GET /stats: idemcore.Stats.
type AdminStats struct {
	// Retention is the retention window as a Go duration.
	Retention string `json:"retention"`
	// FileSize is the bytes of the file in use by bbolt's pages; 0 for an
	// Operator that is not a FileScanner (see it for what else it counts).
	FileSize int64 `json:"file_size"`
	// Records counts the records by state (idemcore.Stats).
	Records struct {
		Started        int `json:"started"`
		Done           int `json:"done"`
		ExpiredPending int `json:"expired_pending"`
		Corrupt        int `json:"corrupt"`
	} `json:"records"`
	// SinceOpen counts the engine's work since it was opened.
	SinceOpen struct {
		Pruned     uint64 `json:"pruned"`
		Replays    uint64 `json:"replays"`
		Executions uint64 `json:"executions"`
		Conflicts  uint64 `json:"conflicts"`
		Commits    uint64 `json:"commits"`
		Writes     uint64 `json:"writes"`
	} `json:"since_open"`
	// Outbox counts the outbox messages (idemcore.OutboxStats); Retrying and
	// Waiting are among Pending, Delivered counts since Open.
	Outbox struct {
		Pending   int    `json:"pending"`
		Retrying  int    `json:"retrying"`
		Waiting   int    `json:"waiting"`
		Dead      int    `json:"dead"`
		Corrupt   int    `json:"corrupt"`
		Delivered uint64 `json:"delivered"`
	} `json:"outbox"`
}

// newAdminStats is the one place that reads idemcore.FileStats and idemcore.Stats.
func newAdminStats(fs idemcore.FileStats, s idemcore.Stats, retention time.Duration) AdminStats {
	var out AdminStats
	out.Retention = retention.String()
	out.FileSize = fs.FileSize
	out.Records.Started, out.Records.Done = fs.Started, fs.Done
	out.Records.ExpiredPending, out.Records.Corrupt = fs.ExpiredPending, fs.Corrupt
	out.SinceOpen.Pruned, out.SinceOpen.Replays = s.Pruned, s.Replays
	out.SinceOpen.Executions, out.SinceOpen.Conflicts = s.Executions, s.Conflicts
	out.SinceOpen.Commits, out.SinceOpen.Writes = s.Commits, s.Writes
	o := fs.Outbox
	out.Outbox.Pending, out.Outbox.Retrying, out.Outbox.Waiting = o.Pending, o.Retrying, o.Waiting
	out.Outbox.Dead, out.Outbox.Corrupt, out.Outbox.Delivered = o.Dead, o.Corrupt, o.Delivered
	return out
}
