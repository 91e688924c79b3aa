package idem

import "go.etcd.io/bbolt"

// OutboxOptions configure the outbox dispatcher. (Placeholder: being built.)
type OutboxOptions struct{}

// OutboxStats counts outbox messages. (Placeholder: being built.)
type OutboxStats struct{}

func (e *Engine) startOutbox() error                             { return nil }
func (e *Engine) committed()                                     {}
func (e *Engine) outboxStats(tx *bbolt.Tx, s *OutboxStats) error { return nil }
