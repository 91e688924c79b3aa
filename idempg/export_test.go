package idempg

import "time"

// SetClockOffset makes the backends opened with o add offset() to the
// database's clock in every statement that judges a lease: the tests' way
// to move the database's clock, never its client's.
func SetClockOffset(o *Options, offset func() time.Duration) { o.clockOffset = offset }
