package idemtest

import "testing"

func (s *suite[T]) process(t *testing.T)     {}

const (
	envChild = "IDEMTEST_CHILD"
	envRun   = "IDEMTEST_RUN"
)

func runChild[T any](t *testing.T, h Harness[T]) {}

// ChildMain is a stub.
func ChildMain() {}
