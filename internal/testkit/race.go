//go:build race

package testkit

// raceEnabled reports that this test binary was built with -race.
const raceEnabled = true
