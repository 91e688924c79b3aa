package idem

// Options and the policies: the engine's settings, every backend's
// (idemcore.Options), and the bbolt file's (BoltOptions).

import (
	"fmt"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// Defaults for the zero values of Options and BoltOptions (idemcore's, but
// DefaultLockTimeout).
const (
	// MaxKeyLen is the longest idempotency key in bytes: Stripe's limit of 255
	// characters, counted in bytes of UTF-8.
	MaxKeyLen = idemcore.MaxKeyLen
	// DefaultRetention is how long a record stays after it completes (24 h).
	DefaultRetention = idemcore.DefaultRetention
	// DefaultPruneInterval is how often the background pruner runs.
	DefaultPruneInterval = idemcore.DefaultPruneInterval
	// DefaultLockTimeout bounds how long Open waits for the file lock.
	DefaultLockTimeout = time.Second
	// DefaultRetryAfter is the wait an InProgressError suggests.
	DefaultRetryAfter = idemcore.DefaultRetryAfter
	// DefaultReplayCacheBytes bounds the memory of the replay cache (16 MiB).
	DefaultReplayCacheBytes = idemcore.DefaultReplayCacheBytes
	// DefaultMaxResponseSize is the largest response stored, in bytes (1 MiB).
	DefaultMaxResponseSize = idemcore.DefaultMaxResponseSize
)

// InFlightPolicy says what a call does while another call with the same key
// runs (idemcore.InFlightPolicy).
type InFlightPolicy = idemcore.InFlightPolicy

const (
	// InFlightWait: wait for the running call and answer from its outcome.
	InFlightWait = idemcore.InFlightWait
	// InFlightFail: fail at once with ErrInProgress (the IETF draft's HTTP 409).
	InFlightFail = idemcore.InFlightFail
)

// RecoveryPolicy says what to do with an interrupted execution
// (idemcore.RecoveryPolicy).
type RecoveryPolicy = idemcore.RecoveryPolicy

const (
	// RecoverReexecute runs fn again, with CallFrom's Recovered set.
	RecoverReexecute = idemcore.RecoverReexecute
	// RecoverRefuse returns ErrIncomplete until an operator resolves the key.
	RecoverRefuse = idemcore.RecoverRefuse
)

// Options are the engine's settings, the same for every backend
// (idemcore.Options documents each field); Open and OpenFile take them, and
// so does idempg.Open. The bbolt file's own settings are BoltOptions.
type Options = idemcore.Options

// BoltOptions are the settings of the bbolt file that OpenFile opens, beside
// the engine's in Options. The zero value of every field means its default;
// a nil *BoltOptions (Open) means all defaults.
type BoltOptions struct {
	// LockTimeout bounds the wait for the file lock, held by any other Open of
	// the file, in this process or another. Zero means DefaultLockTimeout. The
	// error then matches bbolt's errors.ErrTimeout.
	LockTimeout time.Duration

	// ReadOnly opens the file for inspection: a shared lock (other read-only
	// opens may share the file, a writer may not), no change to the file, no
	// pruner or dispatcher. Replays and Get work; anything that writes fails
	// with bbolt's errors.ErrDatabaseReadOnly. A file with no idem bucket is
	// refused with ErrFormat.
	ReadOnly bool

	// NoSync skips fsync on every commit. UNSAFE: a crash of the machine (not
	// just of the process) may lose records, and a lost started record means a
	// duplicate execution. For tests and benchmarks.
	NoSync bool

	// MaxSize bounds the file, in bytes (bbolt's MaxSize), so that callers
	// minting new keys cannot fill the disk: a commit that would grow the file
	// past it fails with ErrFileFull and stores nothing. bbolt grows the file
	// in steps (doubling up to 1 GiB, then 16 MiB at a time), so the file
	// stops at the last step under MaxSize. Zero or negative means no limit.
	// A file already larger opens, and commits that fit in its free pages go
	// on.
	MaxSize int

	// InitialMmapSize is the size, in bytes, of the memory map bbolt opens
	// the file with (bbolt's InitialMmapSize). A commit that grows the file
	// past the map must remap it, and waits until every read transaction
	// (View, Backup, Records, Messages, ScanFile, a long scan) has ended: calls
	// stall behind a long reader then. A map larger than the file will grow
	// (it costs address space, not memory) lets commits go on beside any
	// reader. Zero means bbolt's default (the file's size, rounded up).
	InitialMmapSize int

	// JournalSize bounds the write-ahead journal beside the file
	// (<path>.journal/, journal.go), in bytes of segment files: a Do's
	// records are made durable there, one fdatasync each, and bbolt is
	// brought up to date behind it; when bbolt falls this far behind, calls
	// wait for it (back-pressure). Zero means DefaultJournalSize; a negative
	// size turns the journal off (every write a bbolt commit, two fsyncs).
	// The journal is off under NoSync and MaxSize too: only a bbolt commit
	// made before the answer knows that the file has room. Whatever it is,
	// Open replays a journal left by an earlier open. The journal is part of
	// the file: copy both, or use Backup or `idem compact`, which write a
	// file that needs none.
	JournalSize int
}

// journalOn reports whether these settings write through the journal.
func (f *BoltOptions) journalOn() bool {
	return f.JournalSize >= 0 && !f.NoSync && f.MaxSize <= 0 && !f.ReadOnly
}

// validate refuses the file's settings that have no meaning: a negative
// LockTimeout or InitialMmapSize. The error wraps ErrOptions.
func (f *BoltOptions) validate() error {
	switch {
	case f.LockTimeout < 0:
		return fmt.Errorf("%w: BoltOptions.LockTimeout is %v; zero means the default, a wait cannot be negative", ErrOptions, f.LockTimeout)
	case f.InitialMmapSize < 0:
		return fmt.Errorf("%w: BoltOptions.InitialMmapSize is %d; zero means bbolt's default", ErrOptions, f.InitialMmapSize)
	}
	return nil
}

// Result describes the answer of Do or DoTx (idemcore.Result documents its
// fields). It is returned beside a non-nil error too.
type Result = idemcore.Result
