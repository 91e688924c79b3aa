package idempg

// notifying wraps a statement that changes a key's row ($1) so that it
// also notifies the key's waiters in other processes (delivered at commit),
// if the row says some wait (its waiters mark, set by WaitChange), unless
// PollOnly. The statement answers one row per row changed.
func (b *backend) notifying(q string) string {
	if b.s.PollOnly {
		return q
	}
	return q + ` RETURNING ` + b.notifySQL("")
}

// Committed implements idemcore.Backend.
func (b *backend) Committed() <-chan struct{} { return b.commits }

// committed wakes the dispatcher after a commit that may have enqueued,
// without blocking.
func (b *backend) committed() {
	select {
	case b.commits <- struct{}{}:
	default:
	}
}

// notifiedOutbox is the listener's callback for another process's enqueue.
func (b *backend) notifiedOutbox() { b.committed() }
