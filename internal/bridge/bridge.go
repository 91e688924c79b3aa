// Package bridge hands the root package's unexported helpers to the
// backends in other packages of the module (idempg), without exporting them
// to users.
package bridge

// EngineOptions is the root package's conversion of the engine settings,
// func(*idem.Options) core.Options, set by its init: the one place that
// turns idem.Options into the state machine's options, for every backend.
// It is typed any because this package cannot import the root package (the
// root imports it); a backend asserts it, as
// bridge.EngineOptions.(func(*idem.Options) core.Options).
var EngineOptions any
