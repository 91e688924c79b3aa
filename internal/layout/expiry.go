package layout

import "time"

// Expiry is when a record leaves its retention window, the one rule the
// engine, the CLI and the admin handler share: never (the zero time) for a
// started record kept until resolved; else at, the time it completed (when
// it started, while started), plus the longer of recorded (the window it was
// written under) and retention (the reader's; 0 for the record's own).
func Expiry(keptUntilResolved bool, at time.Time, recorded, retention time.Duration) time.Time {
	if keptUntilResolved {
		return time.Time{}
	}
	return at.Add(max(recorded, retention))
}
