package idemcore

// Stats counts the engine's work since it opened, from counters in memory:
// it reads no store and takes no lock, and works after Close too (the final
// counts).
type Stats struct {
	// Since the engine opened: records pruned, answers replayed from
	// storage, executions of fn, and calls refused for a fingerprint
	// mismatch.
	Pruned, Replays, Executions, Conflicts uint64
	// Commits made and the writes they carried (their ratio is the
	// group-commit batch size), for a backend that counts them
	// (Info.Commits: bbolt); zero otherwise.
	Commits, Writes uint64
	// Delivered counts the outbox messages delivered and removed by this
	// engine's dispatcher.
	Delivered uint64
	// Replayed counts the writes replayed from the backend's journal when
	// it opened (Info.Replayed: bbolt's write-ahead journal, after a crash
	// or a power cut); zero otherwise.
	Replayed uint64
}

// Stats returns the engine's counters, at the cost of a few atomic loads.
func (e *Engine[T]) Stats() Stats {
	s := Stats{
		Pruned: e.n.Pruned.Load(), Replays: e.n.Replays.Load(),
		Executions: e.n.Executions.Load(), Conflicts: e.n.Conflicts.Load(),
		Delivered: e.ob.delivered.Load(), Replayed: e.info.Replayed,
	}
	if c := e.info.Commits; c != nil {
		s.Commits, s.Writes = c()
	}
	return s
}

// FileStats counts what an engine's store holds, as a scan of it found it
// (idem.Engine.ScanFile: one read transaction over the bbolt file).
type FileStats struct {
	// Records by state, inside the retention window.
	Started, Done int
	// ExpiredPending counts records past the retention window that the pruner
	// has not reclaimed yet; every reader already treats them as absent.
	ExpiredPending int
	// Corrupt counts records that fail to decode (see `idem check`).
	Corrupt int
	// FileSize is the bytes of the store in use (bbolt: its pages, Tx.Size;
	// the file on disk may be larger, preallocated for growth).
	FileSize int64
	// Outbox counts the outbox messages by state.
	Outbox OutboxStats
}

// OutboxStats counts outbox messages (FileStats.Outbox).
type OutboxStats struct {
	// Pending counts the messages not delivered yet and not dead: the
	// outbox's length. Retrying and Waiting are among them.
	Pending int
	// Retrying counts the pending messages that have failed at least once.
	Retrying int
	// Waiting counts the pending messages whose topic has no handler in this
	// engine (a tool that registers no handlers sees every message waiting).
	Waiting int
	// Dead counts the dead letters inside their retention.
	Dead int
	// Corrupt counts the messages, pending or dead, that fail to decode.
	Corrupt int
	// Delivered counts the messages delivered and removed since the engine
	// opened.
	Delivered uint64
}
