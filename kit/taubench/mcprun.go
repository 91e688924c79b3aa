package taubench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"sync"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/idemmcp"
)

// RunMCP plays the benchmark over MCP: for every task, the 16 retail tools
// are served by an MCP server in a child process over stdio (ServeMCP: in
// Idem mode through idemmcp, write tools in the DoTx form; in Baseline mode
// without dedupe), and the task's calls are driven through a go-sdk client
// whose idemmcp.ClientMiddleware sends one key per logical call. The
// schedules act at the protocol: a duplicate sent again with the same key, two
// identical calls in flight at once, a response dropped by the client's
// transport after the server answered (the call is abandoned and retried with
// the same key), the server SIGKILLed at a random point of one random write
// call and restarted on the same file (the call retried with the same key),
// and a retry with mutated arguments. Extra effects are read from the
// server's own count (EffectsBucket), committed with each change. cfg is as
// for Run; Executable must call ChildMain first thing.
func RunMCP(ctx context.Context, cfg Config) (*Report, error) {
	return RunMCPWith(ctx, cfg, MCPOptions{})
}

// MCPOptions adapt RunMCPWith.
type MCPOptions struct {
	// Command returns the command a task's calls are sent to, speaking MCP
	// over its stdin and stdout, for the tool server sc: a proxy in front
	// of MCPServerCommand(exe, sc), for example. Its Stderr is set by the
	// runner; files it makes beside sc.DB, named sc.DB followed by a dot and
	// a suffix, are removed with sc.DB after the task. Nil means
	// MCPServerCommand(cfg.Executable, sc). Under the crash schedule, the
	// command's own process must die of SIGKILL, unless Recovers.
	Command func(exe string, sc ServeConfig) (*exec.Cmd, error)
	// Recovers says the command may survive the kill of its tool server and
	// answer the call itself, as idem mcp-proxy does: it restarts the server
	// and re-executes the call with _meta idemmcp.MetaRecovered true. Under
	// the crash schedule, a call that answers is then accepted (the agent
	// reads that answer, with no retry of its own) if the tool server ran
	// it recovered (RecoveredBucket holds its key; else the run fails: the
	// server was not killed); a call that fails is handled as without
	// Recovers. The extra effects of recovered calls are counted in
	// Row.RecoveredEffects, not Row.ExtraEffects.
	Recovers bool
	// Via is the report's Via; empty means ViaMCP.
	Via string
	// IdemServer is the Row.Server of the idem rows; empty means
	// ServerIdemMCP. The baseline rows' is ServerPlain.
	IdemServer string
	// IdemRecords is the Row.Records of the idem rows, where the command
	// keeps idem's records; empty means the run's backend.
	IdemRecords Backend
}

// RunMCPWith is RunMCP with the tool server started by opts.
func RunMCPWith(ctx context.Context, cfg Config, opts MCPOptions) (*Report, error) {
	if opts.Command == nil {
		opts.Command = MCPServerCommand
	}
	via := cmp.Or(opts.Via, ViaMCP)
	rowOf := func(mode Mode) (string, Backend) {
		if mode == Idem {
			return cmp.Or(opts.IdemServer, ServerIdemMCP), cmp.Or(opts.IdemRecords, cfg.backend())
		}
		return ServerPlain, ""
	}
	return runAll(ctx, cfg, via, rowOf, func(ctx context.Context, cfg *Config, task Task, sched Schedule, mode Mode, pl place, initial snapshot) (outcome, error) {
		p := &mcpPlay{cfg: cfg, opts: &opts, task: task, sched: sched, mode: mode, pl: pl}
		return p.run(ctx, initial)
	})
}

// mcpPlay is one task played over MCP under one schedule in one mode.
type mcpPlay struct {
	cfg   *Config
	opts  *MCPOptions
	task  Task
	sched Schedule
	mode  Mode
	pl    place

	srv *mcpServer
	// recoveredKey is the key of the crash call the command answered after
	// recovering it (MCPOptions.Recovers), checked in RecoveredBucket.
	recoveredKey string
}

// mcpServer is a running tool server child and the client's session to it.
type mcpServer struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	cs     *mcp.ClientSession
	drop   *dropper
}

// key is the idempotency key of action i, minted once per logical call (as
// Run's).
func (p *mcpPlay) key(i int) string {
	r := rand.New(rand.NewPCG(p.cfg.Seed, uint64(p.task.ID)<<16|uint64(i)))
	return fmt.Sprintf("tau-%d-%d-%016x", p.task.ID, i, r.Uint64())
}

// start starts a tool server child on the file and connects a client.
func (p *mcpPlay) start(ctx context.Context, crashKey, crashPoint string) error {
	cmd, err := p.opts.Command(p.cfg.Executable, ServeConfig{DB: p.pl.Path, Schema: p.pl.Schema, IdemSchema: p.pl.IdemSchema, PG: p.cfg.PG,
		Idem: p.mode == Idem, CrashKey: crashKey, CrashPoint: crashPoint})
	if err != nil {
		return err
	}
	if env := childEnv(p.pl, p.cfg.PG); env != nil {
		cmd.Env = append(cmd.Env, env...)
	}
	s := &mcpServer{cmd: cmd, drop: &dropper{}}
	cmd.Stderr = &s.stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "taubench-agent", Version: "v1"}, nil)
	client.AddSendingMiddleware(idemmcp.ClientMiddleware(nil))
	s.cs, err = client.Connect(ctx, &dropTransport{inner: &mcp.CommandTransport{Command: cmd}, d: s.drop}, nil)
	if err != nil {
		return fmt.Errorf("connect to the tool server: %w (%s)", err, s.stderr.String())
	}
	p.srv = s
	return nil
}

// stop closes the session: the server exits and releases the file.
func (p *mcpPlay) stop() error {
	if p.srv == nil {
		return nil
	}
	err := p.srv.cs.Close()
	p.srv = nil
	return err
}

func (p *mcpPlay) run(ctx context.Context, initial snapshot) (out outcome, err error) {
	rng := rand.New(rand.NewPCG(p.cfg.Seed, uint64(p.task.ID)))
	crashAt, point := -1, ""
	if p.sched == Crash {
		var writes []int
		for i, a := range p.task.Actions {
			if t, ok := Lookup(a.Name); ok && t.Write {
				writes = append(writes, i)
			}
		}
		if len(writes) > 0 {
			crashAt = writes[rng.IntN(len(writes))]
			point = []string{MCPBeforeCommit, MCPAfterCommit}[rng.IntN(2)]
		}
	}
	crashKey := ""
	if crashAt >= 0 {
		crashKey = p.key(crashAt)
		out.crash = &CrashChoice{Task: p.task.ID, Action: crashAt, Point: point, Killed: KilledToolServer}
	}
	if err := p.start(ctx, crashKey, point); err != nil {
		return out, err
	}
	defer func() {
		if cerr := p.stop(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	for i, a := range p.task.Actions {
		var seen []answer
		if i == crashAt {
			seen, err = p.crash(ctx, i)
		} else {
			seen, err = p.schedule(ctx, i)
		}
		if err != nil {
			return out, fmt.Errorf("action %d (%s): %w", i, a.Name, err)
		}
		recovered := i == crashAt && p.recoveredKey != ""
		for _, s := range seen {
			if s.refused || !EqualJSON(s.output, a.Output) {
				what := "action"
				if recovered {
					out.recoveredDiverged++
					what = "recovered action"
				} else {
					out.diverged++
				}
				if len(out.notes) < 3 {
					out.notes = append(out.notes, fmt.Sprintf("%s %d %s: got %.120q, want %.120q", what, i, a.Name, s.output, a.Output))
				}
			}
		}
	}
	if err := p.stop(); err != nil {
		return out, err
	}
	db, err := openDB(ctx, p.pl, false, p.cfg.PG)
	if err != nil {
		return out, err
	}
	defer db.close()
	effects, rec, err := db.ledger(ctx)
	if err != nil {
		return out, err
	}
	out.recovered = len(rec)
	if p.recoveredKey != "" && !rec[p.recoveredKey] {
		return out, fmt.Errorf("action %d answered, but the tool server never ran it recovered: it was not killed", crashAt)
	}
	for k, n := range effects {
		if rec[k] {
			out.recoveredExtra += max(0, n-1)
		} else {
			out.extra += max(0, n-1)
		}
	}
	final, err := db.snapshot(ctx)
	if err != nil {
		return out, err
	}
	out.state = DiffChanged(initial, final, p.task.Changed)
	return out, nil
}

// call sends action i with args once, with the action's key.
func (p *mcpPlay) call(ctx context.Context, i int, args map[string]any) (answer, error) {
	a := p.task.Actions[i]
	res, err := p.srv.cs.CallTool(idemmcp.WithKey(ctx, p.key(i)), &mcp.CallToolParams{Name: a.Name, Arguments: args})
	if ref, ok := idemmcp.RefusalOf(err); ok && ref.Type == idemmcp.TypeConflict {
		return answer{refused: true}, nil
	}
	if err != nil {
		return answer{}, err
	}
	if res.IsError || len(res.Content) != 1 {
		return answer{}, fmt.Errorf("tool error: %v", res.Content)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		return answer{}, fmt.Errorf("content is %T, not text", res.Content[0])
	}
	return answer{output: tc.Text}, nil
}

// schedule sends action i as the schedule says and returns the answers the
// agent reads.
func (p *mcpPlay) schedule(ctx context.Context, i int) ([]answer, error) {
	a := p.task.Actions[i]
	args := a.Kwargs
	call := func(args map[string]any) (answer, error) { return p.call(ctx, i, args) }
	lose := func(args map[string]any) error { return p.lose(ctx, i, args) }
	return playSchedule(p.sched, a.Name, args, call, lose)
}

// lose sends action i and has the client's transport drop the server's
// response: the server answered, the agent never hears it and abandons the
// call (the SDK cancels it).
func (p *mcpPlay) lose(ctx context.Context, i int, args map[string]any) error {
	dropped := p.srv.drop.arm()
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.call(callCtx, i, args)
		done <- err
	}()
	select {
	case <-dropped:
		cancel()
		<-done
		return nil
	case err := <-done:
		return fmt.Errorf("the response was not dropped: %v", err)
	}
}

// crash sends action i to a server armed to SIGKILL itself during it,
// checks that it died so, restarts it on the same file and retries the call
// with the same key: the agent reads the retry's answer. Under
// MCPOptions.Recovers, a call that answers is the recovered call's answer,
// which the agent reads.
func (p *mcpPlay) crash(ctx context.Context, i int) ([]answer, error) {
	ans, err := p.call(ctx, i, p.task.Actions[i].Kwargs)
	if err == nil && p.opts.Recovers {
		p.recoveredKey = p.key(i)
		return []answer{ans}, nil
	}
	if err == nil {
		return nil, errors.New("the call answered: the server was not killed")
	}
	srv := p.srv
	_ = p.stop()
	var ws syscall.WaitStatus
	if st := srv.cmd.ProcessState; st != nil {
		ws, _ = st.Sys().(syscall.WaitStatus)
	}
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return nil, fmt.Errorf("the tool server did not die of SIGKILL (%v; %s)", err, srv.stderr.String())
	}
	if err := p.start(ctx, "", ""); err != nil {
		return nil, err
	}
	ans, err = p.call(ctx, i, p.task.Actions[i].Kwargs)
	return []answer{ans}, err
}

// dropTransport is a client transport whose connection can drop the next
// response it reads, as a network that loses the server's answer.
type dropTransport struct {
	inner mcp.Transport
	d     *dropper
}

func (t *dropTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &dropConn{Connection: c, d: t.d}, nil
}

// dropper drops the next response once armed.
type dropper struct {
	mu      sync.Mutex
	dropped chan struct{} // non-nil while armed
}

// arm makes the next response be dropped; the channel closes when it is.
func (d *dropper) arm() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dropped = make(chan struct{})
	return d.dropped
}

// take reports whether msg is to be dropped, disarming.
func (d *dropper) take(msg jsonrpc.Message) bool {
	if _, ok := msg.(*jsonrpc.Response); !ok {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dropped == nil {
		return false
	}
	close(d.dropped)
	d.dropped = nil
	return true
}

type dropConn struct {
	mcp.Connection
	d *dropper
}

func (c *dropConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		msg, err := c.Connection.Read(ctx)
		if err != nil || !c.d.take(msg) {
			return msg, err
		}
	}
}
