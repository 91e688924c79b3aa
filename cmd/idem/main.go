// Command idem inspects and repairs an idem file: the bbolt file in which
// github.com/idemkit/idem records the outcome of every idempotency key.
//
//	idem stats                        counts of records by state, file size
//	idem ls [--state S] [--limit N]   the live records, one a line
//	idem get KEY                      one record, with its response
//	idem forget KEY                   delete a record: the key is new again
//	idem resolve KEY --response R     complete an interrupted execution by hand
//	idem prune                        reclaim the space of expired records
//	idem check                        bbolt's consistency check, then decode every record
//	idem compact SRC DST              rewrite SRC into a new, smaller file DST
//	idem outbox ls [--dead]           the outbox's messages, or its dead letters
//	idem outbox get SEQ               one message, with its payload
//	idem outbox retry|drop SEQ...     put dead letters back in the outbox, or delete them
//	idem migrate --pg DSN             create or upgrade the Postgres backend's schema (idempg)
//
// Every command works on a file that no program holds: bbolt lets one process
// open a file for writing, so a file in use gives a one-line error after half a
// second instead of a wait. Inspect a running program through the program. The
// commands that only read (stats, ls, get, check, outbox ls and outbox get)
// open the file read-only, with a shared lock, and never change it.
//
// With --url URL (or $IDEM_URL), stats, get, forget, resolve and outbox
// ls|get|retry|drop talk to a running program's admin handler
// (github.com/idemkit/idem/idemhttp's Admin, mounted at URL) instead: the same
// output, the server's retention window, and --token (or $IDEM_TOKEN, which
// keeps it out of ps) sent as "Authorization: Bearer" to the handler's
// authorization function. The other commands need the file and refuse --url.
//
// Global flags: --db PATH (default idem.db, or $IDEM_DB), --json for one JSON
// document on stdout instead of a table, and --retention and --recovery. Each
// record carries the retention window and the recovery policy it was written
// under, so the commands judge which records have expired from the file, as
// the program does; --retention and --recovery refuse can only lengthen that.
// Errors go to stderr, one line; with --json, a command that fails before
// printing its document prints {"error": {"message", "kind", "exit_status"}}
// on stdout as well. Exit status: 0 on success, 1 on an error or a problem
// found by check, 2 on a usage error.
//
// Keys, responses and payloads are user data: only ls, get, check (for corrupt
// records) and the outbox commands print keys, only get prints a response, and
// only outbox get prints a payload.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/boltfile"
)

// lockTimeout bounds the wait for the file lock: a file held by a running
// program is reported after this long, not waited for.
const lockTimeout = 500 * time.Millisecond

// subcommands builds every subcommand, one file each. Adding a command is
// adding its file and one line here.
var subcommands = []func(*app) *cobra.Command{
	newStatsCmd,
	newLsCmd,
	newGetCmd,
	newForgetCmd,
	newResolveCmd,
	newPruneCmd,
	newCheckCmd,
	newCompactCmd,
	newBenchCmd,
	newOutboxCmd,
	newMigrateCmd,
	newTaubenchCmd,
	newTaubenchChildCmd,
	newTaubenchMCPServerChildCmd,
	newMCPProxyCmd,
}

// readOnlyCommands are the commands that only read the file: openEngine opens
// it for them with idem.BoltOptions.ReadOnly, a shared lock that changes nothing.
var readOnlyCommands = map[string]bool{
	"idem stats": true, "idem ls": true, "idem get": true, "idem check": true,
	"idem outbox ls": true, "idem outbox get": true,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// app is one run of the tool: its flags and its streams.
type app struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer

	// remote is --url and --token: online operation (remote.go).
	remote remoteFlags

	db        string
	json      bool
	retention time.Duration
	recovery  string

	// readOnly is set for the commands in readOnlyCommands.
	readOnly bool
	// deadLetterRetention is --dead-letter-retention, for the commands that
	// have the flag: 0 for each dead letter's own.
	deadLetterRetention time.Duration
	// printed is set once printJSON has written a document: --json prints
	// one, so an error after it goes to stderr only.
	printed bool
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) (code int) {
	defer func() {
		// bbolt panics on some page-level damage; say so in one line.
		if p := recover(); p != nil {
			fmt.Fprintf(stderr, "idem: panic: %v (a damaged file? idem check says; IDEM_TRACE=1 prints the stack)\n", p)
			if getenv("IDEM_TRACE") != "" {
				fmt.Fprintf(stderr, "%s", debug.Stack())
			}
			code = 1
		}
	}()
	a := &app{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCmd()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var (
		ex   *exitError
		line string
	)
	switch {
	case errors.As(err, &ex):
		code, line = ex.code, ex.msg
		if line != "" {
			fmt.Fprintln(stderr, line)
		}
	case errors.As(err, new(*usageError)), strings.HasPrefix(err.Error(), "unknown command "):
		code, line = 2, "idem: "+err.Error()
		fmt.Fprintf(stderr, "%s\nRun 'idem --help' for usage.\n", line)
	default:
		code, line = 1, errorLine(err)
		fmt.Fprintln(stderr, line)
	}
	if line != "" && !a.printed && (a.json || jsonRequested(args)) {
		// --json promises one JSON document on stdout, failures included.
		_ = a.printJSON(errorDocJSON{Error: errorDoc{Message: line, Kind: errorKind(err, code), ExitStatus: code}})
	}
	return code
}

// errorDocJSON is what --json prints on stdout when a command fails before
// printing its document: {"error": {"message", "kind", "exit_status"}}. The
// same line also goes to stderr.
type errorDocJSON struct {
	Error errorDoc `json:"error"`
}

type errorDoc struct {
	// Message is the one line printed on stderr.
	Message string `json:"message"`
	// Kind is a stable word for scripts: usage, in_use, no_file, not_found,
	// invalid_key, in_progress, state, corrupt, format, or error.
	Kind string `json:"kind"`
	// ExitStatus is the process's exit status: 1, or 2 for a usage error.
	ExitStatus int `json:"exit_status"`
}

// errorKind names the case of err for errorDoc.Kind.
func errorKind(err error, code int) string {
	var ex *exitError
	switch {
	case code == 2:
		return "usage"
	case errors.As(err, &ex) && ex.inUse:
		return "in_use"
	case errors.Is(err, errNoFile):
		return "no_file"
	case errors.Is(err, idem.ErrNotFound), errors.Is(err, idem.ErrMessageNotFound):
		return "not_found"
	case errors.Is(err, idem.ErrInvalidKey):
		return "invalid_key"
	case errors.Is(err, idem.ErrInProgress):
		return "in_progress"
	case errors.Is(err, idem.ErrState):
		return "state"
	case errors.Is(err, idem.ErrCorrupt):
		return "corrupt"
	case errors.Is(err, idem.ErrFormat):
		return "format"
	}
	return "error"
}

// jsonRequested reports whether args ask for --json, for errors that stop
// the command line before its flags are parsed.
func jsonRequested(args []string) bool {
	for _, arg := range args {
		if arg == "--" {
			return false
		}
		if arg == "--json" || arg == "--json=true" {
			return true
		}
	}
	return false
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "idem",
		Short: "Inspect and repair an idem file (records of idempotency keys)",
		Long: `idem inspects and repairs the bbolt file in which an idem engine records the
outcome of every idempotency key.

It works on a file that no program holds: stop the program first, or inspect it
through the program. Each record carries the retention window and recovery
policy it was written under: which records have expired is read from the file.
--retention and --recovery refuse can only lengthen that, never shorten it.`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return a.resolveGlobals(cmd) },
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetIn(a.stdin)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	a.addRemote(root)

	f := root.PersistentFlags()
	f.StringVar(&a.db, "db", "idem.db", "path of the idem file; $IDEM_DB, if set, replaces the default")
	f.BoolVar(&a.json, "json", false, `print one JSON document instead of a table (on failure {"error": {...}})`)
	f.DurationVar(&a.retention, "retention", 0, "keep records at least this long (0: each record's own window, recorded in the file; a shorter value changes nothing)")
	f.StringVar(&a.recovery, "recovery", "reexecute", "refuse: treat every interrupted execution as kept until resolved; reexecute: each record's own policy, recorded in the file")

	for _, sub := range subcommands {
		c := sub(a)
		if c.Args != nil {
			c.Args = usageArgs(c.Args)
		}
		root.AddCommand(c)
	}
	return root
}

// resolveGlobals applies $IDEM_DB and validates the global flags.
func (a *app) resolveGlobals(cmd *cobra.Command) error {
	if err := missingValue(cmd); err != nil {
		return err
	}
	a.readOnly = readOnlyCommands[cmd.CommandPath()]
	if !cmd.Flags().Changed("db") {
		if p := a.getenv("IDEM_DB"); p != "" {
			a.db = p
		}
	}
	if a.retention < 0 {
		return &usageError{fmt.Errorf("--retention must not be negative, not %v", a.retention)}
	}
	if _, err := a.recoveryPolicy(); err != nil {
		return &usageError{err}
	}
	return a.resolveRemote(cmd)
}

// missingValue refuses a flag whose value is the name of another flag:
// "ls --state --db x" takes "--db" as the state (pflag gives a flag that
// wants a value the next argument, whatever it is), which means the value
// was left out.
func missingValue(cmd *cobra.Command) error {
	var err error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if err != nil || f.Value.Type() == "bool" {
			return
		}
		v := f.Value.String()
		name, isLong := strings.CutPrefix(v, "--")
		if !isLong {
			name, _ = strings.CutPrefix(v, "-")
		}
		if name, _, _ = strings.Cut(name, "="); v == name || name == "" {
			return
		}
		if cmd.Flags().Lookup(name) != nil || (!isLong && len(name) == 1 && cmd.Flags().ShorthandLookup(name) != nil) {
			err = &usageError{fmt.Errorf("--%s needs a value; it was followed by the flag %s", f.Name, v)}
		}
	})
	return err
}

func (a *app) recoveryPolicy() (idem.RecoveryPolicy, error) {
	switch a.recovery {
	case "reexecute":
		return idem.RecoverReexecute, nil
	case "refuse":
		return idem.RecoverRefuse, nil
	}
	return 0, fmt.Errorf("--recovery must be reexecute or refuse, not %q", a.recovery)
}

// openEngine opens the file at a.db for a command: read-only (a shared lock,
// no change to the file) for the commands in readOnlyCommands, else for
// writing. The file must exist and already be an idem file: no command
// creates one. A file held by a program gives the one-line in-use error.
func (a *app) openEngine() (*idem.Engine, error) {
	if a.readOnly {
		// The engine checks the format itself, and writes nothing.
		if err := mustExist(a.db); err != nil {
			return nil, err
		}
		if err := checkFile(a.db); err != nil {
			return nil, err
		}
	} else if err := preflight(a.db); err != nil {
		return nil, err
	}
	recovery, _ := a.recoveryPolicy()
	e, err := idem.OpenFile(a.db, &idem.BoltOptions{ReadOnly: a.readOnly, LockTimeout: lockTimeout}, &idem.Options{
		// The engine keeps a record the longer of its own window and
		// Retention: the shortest window leaves each record's own.
		Retention:     max(a.retention, time.Nanosecond),
		Recovery:      recovery,
		PruneInterval: -1,
		// The same for dead letters: each one's own retention, or longer.
		Outbox: idem.OutboxOptions{DeadLetterRetention: max(a.deadLetterRetention, time.Nanosecond)},
	})
	if err != nil {
		return nil, openError(a.db, err)
	}
	return e, nil
}

// preflight checks, without writing, that path is an existing idem file that
// no program holds: idem.Open would create a missing file, or add the
// engine's buckets to any other bbolt file. A read-only open of the engine
// refuses both, and changes nothing.
func preflight(path string) error {
	if err := mustExist(path); err != nil {
		return err
	}
	if err := checkFile(path); err != nil {
		return err
	}
	e, err := idem.OpenFile(path, &idem.BoltOptions{ReadOnly: true, LockTimeout: lockTimeout}, &idem.Options{
		PruneInterval: -1,
	})
	if err != nil {
		return openError(path, err)
	}
	return e.Close()
}

// openReadOnly opens path with bbolt read-only (a shared lock), failing on a
// missing file, a damaged one (checkFile), or one that a program holds.
func openReadOnly(path string) (*bbolt.DB, error) {
	if err := mustExist(path); err != nil {
		return nil, err
	}
	if err := checkFile(path); err != nil {
		return nil, err
	}
	db, err := boltfile.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if err != nil {
		return nil, openError(path, err)
	}
	return db, nil
}

// errNoFile is the cause when the file a command works on does not exist.
var errNoFile = errors.New("no such file")

// checkFile reads the file's meta pages before bbolt maps it: on a file
// truncated below its last page in use, bbolt's reads fault (SIGBUS) and kill
// the tool. Damage is an error wrapping idem.ErrCorrupt; a file that is not a
// bbolt file at all is left to openError.
func checkFile(path string) error {
	err := boltfile.CheckFile(path)
	if errors.Is(err, boltfile.ErrDamaged) {
		return &damagedError{path: path, err: err}
	}
	return nil
}

// damagedError is a file with page-level damage that bbolt must not open.
type damagedError struct {
	path string
	err  error // wraps boltfile.ErrDamaged
}

func (e *damagedError) Error() string {
	return fmt.Sprintf("idem: %s: %v; restore it from a backup", e.path, e.err)
}

func (e *damagedError) Unwrap() []error { return []error{idem.ErrCorrupt, e.err} }

func mustExist(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("idem: %s: %w", path, errNoFile)
		}
		return fmt.Errorf("idem: %w", err)
	}
	if fi.Size() == 0 {
		return fmt.Errorf("idem: %s: not an idem file (empty)", path)
	}
	return nil
}

// openError explains a failed open: the in-use case in the one line the
// operator needs, anything else as it is.
func openError(path string, err error) error {
	if errors.Is(err, bolterrors.ErrTimeout) {
		return &exitError{code: 1, msg: inUseMessage(path), inUse: true}
	}
	var op *idem.OpError
	if errors.As(err, &op) && op.Op == "open" {
		err = op.Err // the path is said below
	}
	if errors.Is(err, bolterrors.ErrInvalid) || errors.Is(err, bolterrors.ErrVersionMismatch) {
		return fmt.Errorf("idem: %s: not an idem file: %w", path, err)
	}
	if errors.Is(err, idem.ErrFormat) {
		return formatError(path, err)
	}
	return fmt.Errorf("idem: open %s: %w", path, err)
}

// formatError says why the engine refused the file, in preflight's words:
// "idem: PATH: not an idem file (...)", or its format's problem.
func formatError(path string, err error) error {
	detail := err.Error()
	if d, ok := strings.CutPrefix(detail, idem.ErrFormat.Error()+": "); ok && strings.HasPrefix(d, "not an idem file") {
		detail = d
	}
	return fmt.Errorf("idem: %s: %s", path, detail)
}

func inUseMessage(path string) string {
	return fmt.Sprintf("idem: %s is in use by another program; the idem tool works on a file no program holds (stop the program, or inspect through it)", path)
}

// exitError ends the run with code, printing msg (if any) to stderr as is.
type exitError struct {
	code  int
	msg   string
	inUse bool // the file is held by another program
}

func (e *exitError) Error() string { return e.msg }

// usageError is a bad command line: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := missingValue(cmd); err != nil {
			return err // before the arguments: a missing value shifts them
		}
		if err := check(cmd, args); err != nil {
			return &usageError{fmt.Errorf("%s: %w (usage: %s)", cmd.Name(), err, cmd.UseLine())}
		}
		return nil
	}
}

// errorLine renders err as one line starting with "idem:". The library's
// errors (*idem.OpError) and the CLI's own carry the prefix once and print as
// they are; any other error gets it.
func errorLine(err error) string {
	s := err.Error()
	if !strings.HasPrefix(s, "idem: ") {
		s = "idem: " + s
	}
	return strings.ReplaceAll(s, "\n", "; ")
}

// closeEngine closes e and keeps the first error.
func closeEngine(e interface{ Close() error }, err *error) {
	if cerr := e.Close(); cerr != nil && *err == nil {
		*err = fmt.Errorf("idem: close: %w", cerr)
	}
}

// printJSON writes v as one indented JSON document.
func (a *app) printJSON(v any) error {
	a.printed = true
	enc := json.NewEncoder(a.stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table returns a tabwriter for aligned human output; Flush it.
func (a *app) table() *tabwriter.Writer {
	return tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
}

// expiresAt is when r leaves the retention window: its own window, or
// --retention if longer; zero means never (an interrupted execution kept until
// resolved, or any under --recovery refuse).
func (a *app) expiresAt(r *idem.Record) time.Time {
	if r.State == idem.StateStarted && a.recovery == "refuse" {
		return time.Time{}
	}
	return recordExpiry(r, a.retention)
}

// retentionNote says which retention window the counts follow.
func (a *app) retentionNote() string {
	if a.retention == 0 {
		return "each record's own retention window"
	}
	return fmt.Sprintf("retention at least %v", a.retention)
}

// recordJSON is a record in JSON output: idemhttp's JSON form of a record,
// the admin handler's too (get shows the response, ls its size only).
type recordJSON = idemhttp.AdminRecord

// errorJSON is a stored error in JSON output.
type errorJSON = idemhttp.AdminErrorJSON

// recordJSON renders r, with its response if show, and its expiry as this
// command judges it (--retention, --recovery).
func (a *app) recordJSON(r *idem.Record, show bool) recordJSON {
	return idemhttp.NewAdminRecord(r, a.expiresAt(r), show)
}

// Human renderings.

func fmtTime(t *time.Time, zero string) string {
	if t == nil {
		return zero
	}
	return t.Format(time.RFC3339)
}

func fmtSize(n *int) string {
	if n == nil {
		return "-"
	}
	return fmtBytes(int64(*n))
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func fmtErr(e *errorJSON) string {
	switch {
	case e == nil:
		return "-"
	case e.Code != "":
		return e.Code
	}
	return "(no code)"
}

// quoteKey prints a key as it is when that is unambiguous in a table, and
// Go-quoted when it has spaces, control or invisible characters.
func quoteKey(k string) string {
	if k == "" {
		return `""`
	}
	for _, r := range k {
		if !unicode.IsGraphic(r) || unicode.IsSpace(r) || r == '"' {
			return strconv.Quote(k)
		}
	}
	return k
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// recordExpiry is when r leaves the retention window under retention (0 for
// its own): the engine's rule (idemcore.Expiry); the zero time for never.
func recordExpiry(r *idem.Record, retention time.Duration) time.Time {
	return idemcore.Expiry(r, retention)
}
