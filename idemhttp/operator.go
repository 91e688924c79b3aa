package idemhttp

import (
	"errors"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// Operator is the part of an engine the admin handler drives: the operator
// API every engine offers (the bbolt *idem.Engine, idempg's *Engine, any
// backend's engine over idemcore). See the Engine methods of the same names
// for their errors. An Operator that is also a FileScanner (*idem.Engine)
// has GET /stats count its store in one scan.
type Operator interface {
	// Get returns key's live record (idemcore.ErrNotFound if none).
	Get(key string) (*idemcore.Record, error)
	// Forget deletes key's record in any state.
	Forget(key string) error
	// Resolve completes an interrupted execution by hand.
	Resolve(key string, response []byte, outcome *idemcore.Error) error
	// Messages walks the outbox: pending messages, then dead letters.
	Messages(fn func(m *idemcore.Message, err error) error) error
	// RetryDead puts a dead letter back in the outbox.
	RetryDead(seq uint64) error
	// DropDead deletes a dead letter.
	DropDead(seq uint64) error
	// Records walks the live records.
	Records(fn func(r *idemcore.Record, err error) error) error
	// Stats returns the counters since Open.
	Stats() idemcore.Stats
	// Retention is the retention window, wall-clock.
	Retention() time.Duration
}

// FileScanner is the optional part of an Operator that counts what its
// store holds in one read (*idem.Engine's ScanFile, over the bbolt file).
// For an Operator without it (idempg's engine), GET /stats counts by
// walking Records and Messages: live records only (ExpiredPending 0), no
// store size (FileSize 0), and no Waiting messages (which handlers the
// program registered is its dispatcher's to know).
type FileScanner interface {
	// ScanFile counts the records and messages in the store.
	ScanFile() (idemcore.FileStats, error)
}

// scan counts what the store holds: FileScanner's scan, else walks of the
// records and the messages (see FileScanner).
func (a *admin) scan() (idemcore.FileStats, error) {
	if fs, ok := a.op.(FileScanner); ok {
		return fs.ScanFile()
	}
	var s idemcore.FileStats
	err := a.op.Records(func(r *idemcore.Record, err error) error {
		switch {
		case err != nil && errors.Is(err, idemcore.ErrCorrupt):
			s.Corrupt++
		case err != nil:
			return err
		case r.State == idemcore.StateStarted:
			s.Started++
		default:
			s.Done++
		}
		return nil
	})
	if err != nil {
		return s, err
	}
	err = a.op.Messages(func(m *idemcore.Message, err error) error {
		switch {
		case err != nil && errors.Is(err, idemcore.ErrCorrupt):
			s.Outbox.Corrupt++
		case err != nil:
			return err
		case m.Dead:
			s.Outbox.Dead++
		default:
			s.Outbox.Pending++
			if m.Failures > 0 {
				s.Outbox.Retrying++
			}
		}
		return nil
	})
	s.Outbox.Delivered = a.op.Stats().Delivered
	return s, err
}
