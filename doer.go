package idem

import (
	"time"

	"github.com/idemkit/idem/idemcore"
)

// Doer is the part of an engine that adapters use (idemcore.Doer): Do and
// Retention. Every backend's engine implements it.
type Doer = idemcore.Doer

// TxDoer is a Doer with DoTx (idemcore.TxDoer): T is *Tx for this package's
// engine, pgx.Tx for idempg's.
type TxDoer[T any] = idemcore.TxDoer[T]

var _ TxDoer[*Tx] = (*Engine)(nil)

// Retention is the retention window the engine was opened with, wall-clock.
func (e *Engine) Retention() time.Duration { return e.c.Retention() }
