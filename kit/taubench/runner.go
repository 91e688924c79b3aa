package taubench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

// Schedule is a fault schedule: how the agent's calls reach the tools.
type Schedule string

// The fault schedules, in the order the report lists them.
const (
	// None sends every call once: it validates the tool implementations.
	None Schedule = "none"
	// Duplicate sends every call twice in a row; the agent reads both answers.
	Duplicate Schedule = "duplicate"
	// Lost runs every call, drops its response, and retries it with the same
	// key; the agent reads the retry's answer.
	Lost Schedule = "lost"
	// Concurrent has two identical calls in flight at the same moment; the
	// agent reads both answers.
	Concurrent Schedule = "concurrent"
	// Crash kills the process with SIGKILL at a random point of one random
	// write call (a real child process); the parent reopens the file and the
	// agent retries that call, then goes on.
	Crash Schedule = "crash"
	// Mutated retries every write call, after it answered, with the same key
	// and changed arguments: the retry must be refused, the original's effect
	// stands, and the agent keeps the original answer.
	Mutated Schedule = "mutated"
)

// Schedules lists every schedule, in report order.
var Schedules = []Schedule{None, Duplicate, Lost, Concurrent, Crash, Mutated}

// Mode is how a run reaches the tools.
type Mode string

const (
	// Baseline calls the tools directly, one bbolt transaction per call, with
	// no dedupe: what an agent without idem gets.
	Baseline Mode = "baseline"
	// Idem runs every write call through Engine.DoTx with a key minted once
	// per logical call and the canonical arguments as fingerprint.
	Idem Mode = "idem"
)

// Config is one run of the benchmark.
type Config struct {
	// DataDir holds orders.json, users.json and products.json.
	DataDir string
	// Sample says the data is the built-in sample (WriteSample), not
	// τ-bench's: the report says so (Report.Sample).
	Sample bool
	// Tasks are the tasks to play.
	Tasks []Task
	// TasksFile is where Tasks came from; crash children read it again.
	TasksFile string
	// Schedules to play; nil means all.
	Schedules []Schedule
	// Baseline also plays every schedule without dedupe.
	Baseline bool
	// Seed drives every random choice (crash points, keys).
	Seed uint64
	// WorkDir holds the per-run database files; empty means a temporary
	// directory, removed afterwards.
	WorkDir string
	// Executable is the program a crash child runs: it is started with two
	// arguments, ChildCommand and a spec, and must then call RunChild with
	// the spec (cmd/idem has a hidden subcommand for it; a test binary calls
	// ChildMain from TestMain). Empty means os.Executable().
	Executable string
	// Progress, if not nil, is called after each task run.
	Progress func(done, total int)
	// Backend keeps the task databases and idem's records: Bolt (empty
	// means Bolt) or Postgres.
	Backend Backend
	// PG is the Postgres server of the Postgres backend, a pgx DSN. The run
	// makes its schemas there, named taubench_ and a random prefix: the
	// seeded template, one per task run (dropped after it) and one per row
	// of the report for idempg's tables (dropped at the end). It gives the
	// DSN to its children in their environment (IDEM_TAUBENCH_CHILD_PG).
	PG string
}

// Row is one line of the report: a schedule played in one mode.
type Row struct {
	Schedule Schedule `json:"schedule"`
	Mode     Mode     `json:"mode"`
	// Matched counts tasks whose every answer the agent read equals the
	// reference and whose changed records equal the task's.
	Matched int `json:"matched"`
	Tasks   int `json:"tasks"`
	// Diverged counts answers the agent read that differ from the reference,
	// except those of recovered calls (RecoveredDiverged).
	Diverged int `json:"diverged_outputs"`
	// ExtraEffects counts write executions that changed the database beyond
	// one per logical call.
	ExtraEffects int `json:"extra_effects"`
	// StateMismatches counts tasks whose changed records differ.
	StateMismatches int `json:"state_mismatches"`
	// RecoveredCalls counts write calls that a proxy in front of the tool
	// server (idem mcp-proxy, RunMCPWith with MCPOptions.Recovers)
	// re-executed after the server was killed during them: over MCP only.
	RecoveredCalls int `json:"recovered_calls,omitempty"`
	// RecoveredEffects counts the extra effects of those calls (write
	// executions beyond one per logical call), not in ExtraEffects: a
	// server without idem killed after it committed, before it answered,
	// runs the call again when the proxy re-executes it. OK ignores them.
	RecoveredEffects int `json:"recovered_effects,omitempty"`
	// RecoveredDiverged counts the answers of those calls that differ from
	// the reference, not in Diverged: the re-execution of a call whose
	// effect had committed meets its own effect (a cancelled order cannot
	// be cancelled again) and answers an error. A task with one is not
	// Matched.
	RecoveredDiverged int `json:"recovered_diverged_outputs,omitempty"`
	// Takeovers counts crashed calls of the Do form (FormDo, Postgres
	// only) that the runner took over from the killed child once its
	// lease lapsed: a second process whose fn saw CallFrom's Recovered. A
	// Do-form crash without one fails the run.
	Takeovers int `json:"takeovers,omitempty"`
	// Server is, over MCP (Report.Via ViaMCP or ViaMCPProxy), the tool
	// server process the row's calls reach, the one its crash schedule
	// kills: ServerIdemMCP, ServerPlain or ServerMCPProxy. Empty for direct
	// runs, whose crash schedule kills a crash child (CrashChoice.Killed).
	Server string `json:"server,omitempty"`
	// Records is where an idem row kept idem's records: the report's
	// Backend, or Bolt for the file of idem mcp-proxy (ServerMCPProxy) in
	// front of a tool server whose tables are on Backend. Empty for
	// baseline rows, which keep none.
	Records Backend `json:"records,omitempty"`
	// Failures describes the first few mismatches, for debugging.
	Failures []string `json:"failures,omitempty"`
	// Crashes are the crash schedule's random choices, one per task that
	// has a write call, in task order: the seed decides them, and both
	// modes of a run make the same ones.
	Crashes []CrashChoice `json:"crashes,omitempty"`
}

// The values of Report.Via: how the agent's calls reached the tools.
const (
	// ViaDirect: in-process calls (Run).
	ViaDirect = "direct"
	// ViaMCP: an MCP tool server in a child process over stdio, driven by a
	// go-sdk client (RunMCP).
	ViaMCP = "mcp"
	// ViaMCPProxy: the same client, through idem mcp-proxy in front of the
	// tool server without idem (idem taubench --via mcp-proxy, through
	// RunMCPWith).
	ViaMCPProxy = "mcp-proxy"
)

// The values of Row.Server.
const (
	// ServerIdemMCP: the tool server through idemmcp, write tools in the
	// DoTx form, idem's records beside its tables (RunMCP's idem rows).
	ServerIdemMCP = "idemmcp"
	// ServerPlain: the tool server without idem, one transaction per call
	// (every baseline row over MCP).
	ServerPlain = "plain"
	// ServerMCPProxy: idem mcp-proxy, its records in a bbolt file, in front
	// of the tool server without idem. The crash schedule kills that server,
	// not the proxy, which restarts it and re-executes the call.
	ServerMCPProxy = "mcp-proxy"
)

// The values of CrashChoice.Killed.
const (
	// KilledCrashChild: a child process of the runner that played the task
	// up to the crashed call (Run).
	KilledCrashChild = "crash-child"
	// KilledToolServer: the MCP tool server child, armed to die in the call
	// with the crashed call's key (RunMCP, RunMCPWith).
	KilledToolServer = "tool-server"
)

// CrashChoice is where the crash schedule killed a process of a task: the
// process Killed (KilledCrashChild in a direct run, KilledToolServer over
// MCP), during action Action (an index into the task's actions), at crash
// point Point: in a direct run "taubench-before-commit" (after the tool ran,
// before its transaction committed) or "taubench-after-commit" (after the
// commit, before the answer reached the agent); over MCP MCPBeforeCommit or
// MCPAfterCommit, the same two moments in the tool server. Form is the form
// of the crashed call on the Postgres backend of a direct run, FormDoTx or
// FormDo (how the Idem mode plays it; the baseline plays it directly either
// way); empty on bbolt (DoTx) and over MCP (the server's own form, which
// Row.Server names).
//
// Only a kill after the commit of a call whose reference answer is not an
// error leaves an effect behind: in a baseline row, and in an idem row
// behind idem mcp-proxy, each such kill costs one divergent answer or one
// extra effect (counted as recovered in the latter); every other kill costs
// nothing, so that the kill points can be checked against a row's counts.
type CrashChoice struct {
	Task   int    `json:"task"`
	Action int    `json:"action"`
	Point  string `json:"point"`
	Form   string `json:"form,omitempty"`
	Killed string `json:"killed"`
}

// Report is the outcome of Run.
type Report struct {
	// Via is how the calls reached the tools: ViaDirect, ViaMCP or
	// ViaMCPProxy.
	Via     string  `json:"via"`
	Seed    uint64  `json:"seed"`
	Tasks   int     `json:"tasks"`
	Backend Backend `json:"backend"`
	// Sample is true when the tasks were the built-in sample's
	// (Config.Sample), not τ-bench's.
	Sample bool  `json:"sample,omitempty"`
	Rows   []Row `json:"rows"`
}

// OK reports whether every idem row has no divergent output, no extra
// effect and no state mismatch: every task matched, except tasks whose only
// divergent answers are those of calls a proxy recovered after a kill
// (Row.RecoveredDiverged; what idem mcp-proxy cannot prevent in front of a
// server without idem, which it documents). Without recovered calls, that is
// every task matched.
func (r *Report) OK() bool {
	for _, row := range r.Rows {
		if row.Mode == Idem && ((row.Matched != row.Tasks && row.RecoveredDiverged == 0) || row.Diverged != 0 || row.ExtraEffects != 0 || row.StateMismatches != 0) {
			return false
		}
	}
	return true
}

// Run plays every task against a fresh copy of the database under each
// schedule, in each mode, and compares with the reference.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	direct := func(mode Mode) (string, Backend) {
		if mode == Idem {
			return "", cfg.backend()
		}
		return "", ""
	}
	return runAll(ctx, cfg, ViaDirect, direct, func(ctx context.Context, cfg *Config, task Task, sched Schedule, mode Mode, pl place, initial snapshot) (outcome, error) {
		p := &play{cfg: cfg, task: task, sched: sched, mode: mode, pl: pl}
		return p.run(ctx, initial)
	})
}

// backend is cfg.Backend, Bolt if empty.
func (cfg *Config) backend() Backend {
	if cfg.Backend == "" {
		return Bolt
	}
	return cfg.Backend
}

// runAll is the loop of Run and RunMCPWith over schedules, modes and tasks,
// each task on a fresh copy of the seeded database, with play doing one;
// via is Report.Via, and rowOf gives each mode's Row.Server and Row.Records.
func runAll(ctx context.Context, cfg Config, via string, rowOf func(Mode) (server string, records Backend), play func(ctx context.Context, cfg *Config, task Task, sched Schedule, mode Mode, pl place, initial snapshot) (outcome, error)) (*Report, error) {
	if cfg.Schedules == nil {
		cfg.Schedules = Schedules
	}
	if cfg.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Executable = exe
	}
	work := cfg.WorkDir
	if work == "" {
		dir, err := os.MkdirTemp("", "idem-taubench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		work = dir
	}
	if cfg.Backend == "" {
		cfg.Backend = Bolt
	}
	st, err := newStage(ctx, &cfg, work)
	if err != nil {
		return nil, err
	}
	defer st.close()
	initial := st.initial()
	modes := []Mode{Idem}
	if cfg.Baseline {
		modes = []Mode{Baseline, Idem}
	}
	rep := &Report{Via: via, Seed: cfg.Seed, Tasks: len(cfg.Tasks), Backend: cfg.Backend, Sample: cfg.Sample}
	total, done := len(cfg.Schedules)*len(modes)*len(cfg.Tasks), 0
	for _, sched := range cfg.Schedules {
		for _, mode := range modes {
			row := Row{Schedule: sched, Mode: mode, Tasks: len(cfg.Tasks)}
			row.Server, row.Records = rowOf(mode)
			for _, task := range cfg.Tasks {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				pl, err := st.fresh(ctx, fmt.Sprintf("%s-%s", sched, mode), task.ID, mode == Idem)
				if err != nil {
					return nil, err
				}
				out, err := play(ctx, &cfg, task, sched, mode, pl, initial)
				st.remove(pl)
				if err != nil {
					return nil, fmt.Errorf("task %d, %s, %s: %w", task.ID, sched, mode, err)
				}
				if out.crash != nil {
					row.Crashes = append(row.Crashes, *out.crash)
				}
				row.Diverged += out.diverged
				row.ExtraEffects += out.extra
				row.RecoveredCalls += out.recovered
				row.RecoveredEffects += out.recoveredExtra
				row.RecoveredDiverged += out.recoveredDiverged
				row.Takeovers += out.takeovers
				if len(out.state) > 0 {
					row.StateMismatches++
				}
				if out.diverged == 0 && out.recoveredDiverged == 0 && len(out.state) == 0 {
					row.Matched++
				} else if len(row.Failures) < 5 {
					row.Failures = append(row.Failures, fmt.Sprintf("task %d: %s", task.ID, strings.Join(append(out.notes, out.state...), "; ")))
				}
				done++
				if cfg.Progress != nil {
					cfg.Progress(done, total)
				}
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	return rep, nil
}

// play is one task played under one schedule in one mode.
type play struct {
	cfg   *Config
	task  Task
	sched Schedule
	mode  Mode
	pl    place

	db taskDB

	// killAt is the crash point at which a crash child kills itself
	// (point); empty outside a crash child.
	killAt string

	// doAt is the action played through Do (FormDo) rather than DoTx, -1
	// for none: the crash schedule's crashed call on Postgres, when its
	// choice says so.
	doAt int

	mu        sync.Mutex
	effects   map[int]int // successful write executions per action index
	takeovers int         // runs of doFn that took a lapsed claim over
}

// point is a crash point of the runner's own (the engine's failpoints exist
// only in test builds): a crash child whose killAt names it dies there of
// SIGKILL; anywhere else it does nothing.
func (p *play) point(name string) {
	if p.killAt != "" && p.killAt == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

type outcome struct {
	diverged int
	extra    int
	notes    []string
	state    []string
	crash    *CrashChoice // the crash schedule's choice, if it crashed the task
	// recovered, recoveredExtra and recoveredDiverged: calls a proxy
	// re-executed after a kill, their extra effects (not in extra) and
	// their divergent answers (not in diverged).
	recovered, recoveredExtra, recoveredDiverged int
	takeovers                                    int // Row.Takeovers
}

// key is the idempotency key of action i: minted once per logical call.
func (p *play) key(i int) string {
	r := rand.New(rand.NewPCG(p.cfg.Seed, uint64(p.task.ID)<<16|uint64(i)))
	return fmt.Sprintf("tau-%d-%d-%016x", p.task.ID, i, r.Uint64())
}

func (p *play) open(ctx context.Context) error {
	db, err := openDB(ctx, p.pl, p.mode == Idem, p.cfg.PG)
	p.db = db
	return err
}

func (p *play) close() error {
	if p.db == nil {
		return nil
	}
	err := p.db.close()
	p.db = nil
	return err
}

// answer is what one physical call returned to the agent.
type answer struct {
	output  string
	refused bool // the engine refused the call (fingerprint mismatch)
}

// call sends action i with args once.
func (p *play) call(ctx context.Context, i int, args map[string]any) (answer, error) {
	a := p.task.Actions[i]
	tool, ok := Lookup(a.Name)
	if !ok {
		return answer{}, fmt.Errorf("unknown tool %q", a.Name)
	}
	run := func(s Store) (string, error) {
		out, err := tool.Run(s, args)
		if err == nil && tool.Write && !strings.HasPrefix(out, "Error") {
			p.mu.Lock()
			p.effects[i]++
			p.mu.Unlock()
		}
		return out, err
	}
	if !tool.Write {
		var out string
		err := p.db.read(ctx, func(s Store) error {
			var err error
			out, err = run(s)
			return err
		})
		return answer{output: out}, err
	}
	if p.mode == Baseline {
		var out string
		err := p.db.write(ctx, func(s Store) error {
			var err error
			out, err = run(s)
			if err == nil {
				p.point("taubench-before-commit")
			}
			return err
		})
		if err == nil {
			p.point("taubench-after-commit")
		}
		return answer{output: out}, err
	}
	fp, err := idem.Fingerprint(args)
	if err != nil {
		return answer{}, err
	}
	var res idem.Result
	if i == p.doAt {
		res, err = p.db.do(ctx, p.key(i), fp, func(ctx context.Context) ([]byte, error) {
			return p.doFn(ctx, i, run)
		})
	} else {
		res, err = p.db.doTx(ctx, p.key(i), fp, func(ctx context.Context, s Store) ([]byte, error) {
			if c, _ := idem.CallFrom(ctx); c.Recovered {
				// On either backend a killed DoTx leaves nothing behind
				// (its transaction rolls back): nothing to recover.
				return nil, fmt.Errorf("taubench: DoTx of action %d recovers an interrupted execution (attempt %d)", i, c.Attempt)
			}
			out, err := run(s)
			if err != nil {
				return nil, err
			}
			p.point("taubench-before-commit")
			return []byte(out), nil
		})
	}
	if errors.Is(err, idem.ErrFingerprintMismatch) {
		return answer{refused: true}, nil
	}
	if err != nil {
		return answer{}, err
	}
	p.point("taubench-after-commit")
	return answer{output: string(res.Response)}, nil
}

// doFn is the fn of a write call of the Do form (FormDo): the tool runs in
// a Postgres transaction of its own, which records its answer under the key
// (PgDoAnswers) with its change; the crash points are before and after that
// commit, both inside fn, so that a kill at either leaves the key's claim
// behind for another process to take over once its lease lapses. The taker
// (fn with CallFrom's Recovered) reconciles by the key: an answer recorded
// means the change committed, and it is answered without running the tool
// again; none means nothing committed, and the tool runs.
func (p *play) doFn(ctx context.Context, i int, run func(Store) (string, error)) ([]byte, error) {
	key := p.key(i)
	if c, _ := idem.CallFrom(ctx); c.Recovered {
		p.mu.Lock()
		p.takeovers++
		p.mu.Unlock()
		var (
			out   string
			found bool
		)
		err := p.db.read(ctx, func(s Store) error {
			ps, ok := s.(PgStore)
			if !ok {
				return fmt.Errorf("taubench: the Do form needs the postgres backend, not %T", s)
			}
			var err error
			out, found, err = ps.doAnswer(key)
			return err
		})
		if err != nil {
			return nil, err
		}
		if found {
			return []byte(out), nil
		}
	}
	var out string
	err := p.db.write(ctx, func(s Store) error {
		ps, ok := s.(PgStore)
		if !ok {
			return fmt.Errorf("taubench: the Do form needs the postgres backend, not %T", s)
		}
		var err error
		if out, err = run(s); err != nil {
			return err
		}
		if err := ps.putDoAnswer(key, out); err != nil {
			return err
		}
		p.point("taubench-before-commit")
		return nil
	})
	if err != nil {
		return nil, err
	}
	p.point("taubench-after-commit")
	return []byte(out), nil
}

func (p *play) run(ctx context.Context, initial snapshot) (out outcome, err error) {
	p.effects = map[int]int{}
	p.doAt = -1
	rng := rand.New(rand.NewPCG(p.cfg.Seed, uint64(p.task.ID)))
	crashAt, point, form := -1, "", ""
	if p.sched == Crash {
		var writes []int
		for i, a := range p.task.Actions {
			if t, ok := Lookup(a.Name); ok && t.Write {
				writes = append(writes, i)
			}
		}
		if len(writes) > 0 {
			crashAt = writes[rng.IntN(len(writes))]
			point = crashPoints[rng.IntN(len(crashPoints))]
			if p.cfg.Backend == Postgres {
				// Drawn last, so that the other choices are the bbolt
				// backend's.
				form = crashForms[rng.IntN(len(crashForms))]
			}
		}
	}
	start := 0
	if crashAt >= 0 {
		out.crash = &CrashChoice{Task: p.task.ID, Action: crashAt, Point: point, Form: form, Killed: KilledCrashChild}
		if form == FormDo && p.mode == Idem {
			p.doAt = crashAt
		}
		if err := p.crashChild(ctx, crashAt, point, form); err != nil {
			return out, err
		}
		// The child's execution of the crashed call had its effect if the
		// kill came after the commit.
		if point == "taubench-after-commit" && p.task.Actions[crashAt].Output != "" &&
			!strings.HasPrefix(p.task.Actions[crashAt].Output, "Error") {
			p.effects[crashAt]++
		}
		start = crashAt // the agent retries the crashed call, then goes on
		// Effects of calls before it happened in the child, once each.
		for i := range crashAt {
			if t, _ := Lookup(p.task.Actions[i].Name); t.Write && !strings.HasPrefix(p.task.Actions[i].Output, "Error") {
				p.effects[i]++
			}
		}
	}
	if err := p.open(ctx); err != nil {
		return out, err
	}
	defer func() {
		if cerr := p.close(); err == nil {
			err = cerr
		}
	}()
	for i := start; i < len(p.task.Actions); i++ {
		a := p.task.Actions[i]
		seen, err := p.schedule(ctx, i, i == crashAt)
		if err != nil {
			return out, fmt.Errorf("action %d (%s): %w", i, a.Name, err)
		}
		if i == crashAt && p.doAt == i {
			// The killed child held the key's claim: this process must
			// have taken it over, its fn seeing Recovered.
			if p.takeovers != 1 {
				return out, fmt.Errorf("action %d (%s), killed %s in Do: %d takeovers by this process, want 1", i, a.Name, point, p.takeovers)
			}
			out.takeovers++
		}
		for _, s := range seen {
			if s.refused || !EqualJSON(s.output, a.Output) {
				out.diverged++
				if len(out.notes) < 3 {
					out.notes = append(out.notes, fmt.Sprintf("action %d %s: got %.120q, want %.120q", i, a.Name, s.output, a.Output))
				}
			}
		}
	}
	for _, n := range p.effects {
		out.extra += max(0, n-1)
	}
	final, err := p.db.snapshot(ctx)
	if err != nil {
		return out, err
	}
	out.state = DiffChanged(initial, final, p.task.Changed)
	return out, nil
}

// crashPoints are where a crash child is killed: inside the write call after
// the tool ran but before its transaction committed, or after the commit
// before the answer reached the agent.
var crashPoints = []string{"taubench-before-commit", "taubench-after-commit"}

// The forms of the crashed call in Idem mode (CrashChoice.Form).
const (
	// FormDoTx plays it through DoTx, as every other write call: the tool
	// writes in the transaction of the done record. On Postgres a kill
	// before the commit leaves nothing (the server rolls back).
	FormDoTx = "dotx"
	// FormDo plays it through Do (Postgres only): the tool runs in a
	// transaction of its own inside fn, which also records its answer
	// under the key (PgDoAnswers), and both crash points are inside fn,
	// before and after that commit. The killed child leaves the key's
	// claim behind; the runner (another process) waits for its lease to
	// lapse, takes the key over (fn sees CallFrom's Recovered, counted in
	// Row.Takeovers), and reconciles by the key: the recorded answer if
	// the change committed, else the tool runs.
	FormDo = "do"
)

// crashForms are the forms the Postgres backend's crash schedule draws from.
var crashForms = []string{FormDoTx, FormDo}

// schedule sends action i as the schedule says and returns the answers the
// agent reads.
func (p *play) schedule(ctx context.Context, i int, retryOfCrash bool) ([]answer, error) {
	a := p.task.Actions[i]
	args := a.Kwargs
	if retryOfCrash {
		ans, err := p.call(ctx, i, args)
		return []answer{ans}, err
	}
	call := func(args map[string]any) (answer, error) { return p.call(ctx, i, args) }
	lose := func(args map[string]any) error { _, err := p.call(ctx, i, args); return err }
	return playSchedule(p.sched, a.Name, args, call, lose)
}

// playSchedule sends one action of a tool called name with args as sched
// says, through call (one call whose answer the agent reads) and lose (one
// call whose answer is lost), and returns the answers the agent reads. The
// direct and the MCP runners share it.
func playSchedule(sched Schedule, name string, args map[string]any,
	call func(map[string]any) (answer, error), lose func(map[string]any) error) ([]answer, error) {
	switch sched {
	case None, Crash:
		ans, err := call(args)
		return []answer{ans}, err
	case Duplicate:
		first, err := call(args)
		if err != nil {
			return nil, err
		}
		second, err := call(args)
		return []answer{first, second}, err
	case Lost:
		if err := lose(args); err != nil {
			return nil, err
		}
		ans, err := call(args)
		return []answer{ans}, err
	case Concurrent:
		var (
			wg   sync.WaitGroup
			ans  [2]answer
			errs [2]error
		)
		start := make(chan struct{})
		for j := range 2 {
			wg.Go(func() {
				<-start
				ans[j], errs[j] = call(args)
			})
		}
		close(start)
		wg.Wait()
		return ans[:], errors.Join(errs[:]...)
	case Mutated:
		ans, err := call(args)
		if err != nil {
			return nil, err
		}
		if t, _ := Lookup(name); t.Write {
			// The mutated retry's own answer is not what the agent keeps:
			// under idem it is refused, in the baseline it runs again.
			if _, err := call(mutate(name, args)); err != nil {
				return nil, err
			}
		}
		return []answer{ans}, nil
	}
	return nil, fmt.Errorf("unknown schedule %q", sched)
}

// mutate returns args changed the way a confused agent's retry changes them:
// another reason, another address line, or an extra argument.
func mutate(tool string, args map[string]any) map[string]any {
	m := make(map[string]any, len(args)+1)
	for k, v := range args {
		m[k] = v
	}
	switch {
	case tool == "cancel_pending_order":
		if m["reason"] == "no longer needed" {
			m["reason"] = "ordered by mistake"
		} else {
			m["reason"] = "no longer needed"
		}
	case strings.Contains(tool, "address"):
		m["address2"] = fmt.Sprint(m["address2"]) + " (corrected)"
	default:
		m["note"] = "retry with changed arguments"
	}
	return m
}

// Crash children.

// ChildCommand is the first argument of a crash child: the runner starts
// Config.Executable with ChildCommand and a spec (a JSON document) as its
// only arguments. An argument, not an environment variable, so that no
// setting of a user's environment turns a program into a crash child.
const ChildCommand = "taubench-crash-child"

// childSpec tells a crash child what to run.
type childSpec struct {
	place
	// Form is the crashed call's CrashChoice.Form.
	Form      string   `json:"form,omitempty"`
	TasksFile string   `json:"tasks_file"`
	Task      int      `json:"task"`
	Seed      uint64   `json:"seed"`
	Mode      Mode     `json:"mode"`
	CrashAt   int      `json:"crash_at"`
	Point     string   `json:"point"`
	Schedule  Schedule `json:"schedule"`
}

// crashChild runs the task up to action crashAt in a child process that is
// killed with SIGKILL at point during that action, played in form.
func (p *play) crashChild(ctx context.Context, crashAt int, point, form string) error {
	if p.cfg.TasksFile == "" {
		return errors.New("the crash schedule needs Config.TasksFile")
	}
	spec, err := json.Marshal(childSpec{place: p.pl, TasksFile: p.cfg.TasksFile, Task: p.task.ID, Seed: p.cfg.Seed,
		Mode: p.mode, CrashAt: crashAt, Point: point, Schedule: p.sched, Form: form})
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, p.cfg.Executable, ChildCommand, string(spec))
	cmd.Env = childEnv(p.pl, p.cfg.PG)
	outb, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return nil
		}
	}
	return fmt.Errorf("crash child did not die of SIGKILL at %s (%v): %s", point, err, outb)
}

// ChildMain runs a child of the runner if args (a program's arguments after
// its name) name one, and never returns then: ChildCommand and a spec make a
// crash child, which dies at its crash point, or exits with status 3 on an
// error and 4 if the point was not reached; MCPServerChildCommand and a
// configuration make the MCP tool server of RunMCP, which serves stdio until
// it closes. Otherwise it returns at once. Test binaries that run these
// schedules call it first thing in TestMain with os.Args[1:]; the idem CLI
// has a hidden subcommand for each. Only arguments make a child, never the
// environment.
func ChildMain(args []string) {
	mcpServerMain(args)
	if len(args) != 2 || args[0] != ChildCommand {
		return
	}
	if err := RunChild(args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "taubench child:", err)
		os.Exit(3)
	}
	fmt.Fprintln(os.Stderr, "taubench child: the crash point was not reached")
	os.Exit(4)
}

// RunChild plays a crash child's part: raw, the runner's JSON spec, names
// the file, the task, and the action and crash point at which the child
// kills itself with SIGKILL. It returns only on an error, or with nil if the
// point was not reached.
func RunChild(raw string) error {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fmt.Errorf("crash child spec: %w", err)
	}
	tasks, err := LoadTasks(spec.TasksFile)
	if err != nil {
		return err
	}
	var task *Task
	for i := range tasks {
		if tasks[i].ID == spec.Task {
			task = &tasks[i]
		}
	}
	if task == nil {
		return fmt.Errorf("no task %d in %s", spec.Task, spec.TasksFile)
	}
	cfg := &Config{Seed: spec.Seed, Backend: Bolt}
	if spec.place.Schema != "" {
		cfg.Backend, cfg.PG = Postgres, os.Getenv(envChildPG)
	}
	p := &play{cfg: cfg, task: *task, sched: spec.Schedule, mode: spec.Mode,
		pl: spec.place, effects: map[int]int{}, doAt: -1}
	if spec.Form == FormDo && spec.Mode == Idem {
		p.doAt = spec.CrashAt
	}
	if !slices.Contains(crashPoints, spec.Point) {
		return fmt.Errorf("no crash point %q", spec.Point)
	}
	if spec.CrashAt < 0 || spec.CrashAt >= len(task.Actions) {
		return fmt.Errorf("task %d has no action %d", spec.Task, spec.CrashAt)
	}
	ctx := context.Background()
	if err := p.open(ctx); err != nil {
		return err
	}
	for i := 0; i < spec.CrashAt; i++ {
		if _, err := p.call(ctx, i, task.Actions[i].Kwargs); err != nil {
			return err
		}
	}
	p.killAt = spec.Point
	_, err = p.call(ctx, spec.CrashAt, task.Actions[spec.CrashAt].Kwargs)
	return err
}

// Helpers.

func seedFile(path, dataDir string) error {
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		return err
	}
	if err := Seed(db, dataDir); err != nil {
		db.Close()
		return err
	}
	return db.Close()
}

func snapshotFile(path string) (snapshot, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		return snapshot{}, err
	}
	defer db.Close()
	var s snapshot
	err = db.View(func(tx *bbolt.Tx) error {
		s, err = Snapshot(BoltStore{BoltTx{tx}})
		return err
	})
	return s, err
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Legend explains WriteTable's columns and schedules, one per line.
const Legend = `tasks matching    tasks whose every answer the agent read equals the reference and whose
                  changed records equal the task's
outputs diverged  answers the agent read that differ from the reference, counted one by one
extra effects     write executions beyond one per logical call
state mismatches  tasks whose changed records differ from the task's
modes             idem: every write call through DoTx, a key per logical call;
                  baseline: the tools called directly, no dedupe
schedules         none: every call once; duplicate: every call twice in a row;
                  lost: every answer dropped and the call retried; concurrent: two
                  identical calls at once; crash: a child process killed (SIGKILL)
                  in one write call, then retried; mutated: every write retried
                  with the same key and changed arguments
`

// RecoveredLegend explains the columns WriteTable adds when a row has
// recovered calls (Row.RecoveredCalls), and what they mean.
const RecoveredLegend = `recovered calls   write calls idem mcp-proxy re-executed after it restarted their killed
                  tool server (_meta "io.github.idemkit/recovered": true)
recovered         answers of those calls that differ from the reference, and their extra
  diverged,       effects: not in outputs diverged and extra effects. A server without
  effects         idem killed after its commit runs the call again when it is recovered:
                  the effect happens twice, or the tool meets its own effect and answers
                  an error (a cancelled order cannot be cancelled again). Only a server
                  that reconciles by the key the proxy sends avoids it
`

// WriteTable prints the report as a markdown table under a line naming the
// data (τ-bench's, or the built-in sample), the backend, the tasks and the
// seed, followed by Legend (and
// RecoveredLegend, with the columns recovered calls, recovered diverged and
// recovered effects, if a row has recovered calls).
func WriteTable(w io.Writer, rep *Report) {
	recovered := slices.ContainsFunc(rep.Rows, func(r Row) bool { return r.RecoveredCalls > 0 })
	on := ""
	if rep.Backend != "" && rep.Backend != Bolt {
		on = " on " + string(rep.Backend)
	}
	what := "τ-bench retail"
	if rep.Sample {
		what = "idem's built-in retail sample (generated, not τ-bench's tasks)"
	}
	if rep.Via != "" && rep.Via != ViaDirect {
		on += " via " + rep.Via
	}
	fmt.Fprintf(w, "%s%s, %d tasks, seed %d\n\n", what, on, rep.Tasks, rep.Seed)
	if recovered {
		fmt.Fprintln(w, "| schedule | mode | tasks matching | outputs diverged | extra effects | state mismatches | recovered calls | recovered diverged | recovered effects |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|")
	} else {
		fmt.Fprintln(w, "| schedule | mode | tasks matching | outputs diverged | extra effects | state mismatches |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|")
	}
	rows := append([]Row(nil), rep.Rows...)
	order := map[Schedule]int{}
	for i, s := range Schedules {
		order[s] = i
	}
	sort.SliceStable(rows, func(i, j int) bool { return order[rows[i].Schedule] < order[rows[j].Schedule] })
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %d/%d | %d | %d | %d |", r.Schedule, r.Mode, r.Matched, r.Tasks, r.Diverged, r.ExtraEffects, r.StateMismatches)
		if recovered {
			fmt.Fprintf(w, " %d | %d | %d |", r.RecoveredCalls, r.RecoveredDiverged, r.RecoveredEffects)
		}
		fmt.Fprintln(w)
	}
	for _, r := range rows {
		if r.Takeovers > 0 {
			fmt.Fprintf(w, "\n%s/%s: %d of the crashed calls were in the Do form: a second process took each over after the killed one's lease, its fn seeing Recovered\n", r.Schedule, r.Mode, r.Takeovers)
		}
	}
	fmt.Fprintf(w, "\n%s", Legend)
	if recovered {
		fmt.Fprint(w, RecoveredLegend)
	}
}
