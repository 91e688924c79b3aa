package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem/kit/benchkit"
)

// Flushes per call: a contender runs in a second OS process (this program
// again), and strace, attached to it once its records are stored and its
// warm-up is done, logs every flush the process makes until it exits:
// fsync and fdatasync on any thread (bbolt's background catch-up behind a
// journal included), sync_file_range, syncfs, sync and msync, and the writes
// to files opened O_SYNC or O_DSYNC (each such write is a flush without a
// sync call). The window holds the timed calls, then the contender's Close,
// then an Open and a Close of the same store: a catch-up that a Close leaves
// to the next Open is counted too. strace -y names each call's file, so the
// flushes are counted per file (digits in names folded to #: a journal's
// segments are one line), and the bbolt file's share, which behind a
// journal is the catch-up's, amortised over the calls, is printed apart.
// `strace -f -c -e trace=fsync,fdatasync` on the same process counts the
// same calls.

// SyncsLegend explains the flush-count rows, for the lines under a table
// that holds them.
const SyncsLegend = `
syncs: flushes per call at one caller (fsync, fdatasync, …), counted by strace -f -y attached
to a second process running the contender after its records are stored and its warm-up
done, until it exits: the timed calls, its Close, then an Open and a Close of the same
store (so a catch-up left to Close or to the next Open counts). Every thread counts, so
does bbolt's catch-up behind a journal: the bbolt file's share (idem.db, naive.db), printed
apart per file, is then that catch-up's, amortised over the calls. Other flushes (msync,
syncfs, sync_file_range, writes to files opened O_SYNC/O_DSYNC) count in the total and are
listed after them.
ratio: flushes per call over idem's (lower is fewer). No ops/s: strace slows every call.
`

// syncsEnv names the environment variable that makes this program the
// second process of a flush count: it holds a syncsSpec in JSON.
const syncsEnv = "IDEM_BENCH_SYNCS_CHILD"

// syncsContenders are the contenders whose flushes are their own process's:
// the servers' contenders flush in the server.
var syncsContenders = []string{"idem", "naive-bbolt", "sqlite-full", "sqlite-normal"}

// syncsSpec is what a flush count's second process runs: Ops calls of Kind
// ("first": Do of a fresh key; "dotx": DoTx) by one caller, on Contender
// opened in Dir with Stored records, after Warmup calls.
type syncsSpec struct {
	Contender string `json:"contender"`
	Kind      string `json:"kind"`
	Dir       string `json:"dir"`
	Stored    int    `json:"stored"`
	Ops       int    `json:"ops"`
	Warmup    int    `json:"warmup"`
}

// syncsStore is the directory, under the count's own, of the contender's
// files: the count names files relative to it.
const syncsStore = "store"

// syncsStored bounds the records a flush count's process stores first: the
// number of flushes per commit does not depend on the tree's depth.
const syncsStored = 10_000

// SyncsWorkload counts the flushes per call of kind ("first" or "dotx") at
// one caller, in a second process traced by strace (see above). Its score
// is flushes per call (lower is better), its metrics "syncs/call" (every
// flush), "syncs/call:FILE" (fsync and fdatasync per file) and
// "flushes/call:KIND-FILE" (the others); ops/s and latencies are not given (strace
// slows every call). It needs strace (Debian's package strace) and the right
// to trace a process (root, or ptrace_scope 0); without either the row says
// skipped. ops calls are counted, after warmup ones, on a store of
// min(stored, 10,000) records; the row's fixture is an empty one, whose
// directory (on the disk measured) holds the second process's store.
func SyncsWorkload(kind string, stored, ops, warmup int) benchkit.Workload {
	return benchkit.Workload{
		Name:       fmt.Sprintf("syncs/%s/callers=1", kind),
		Fixture:    benchkit.FixtureSpec{}, // the second process stores its own records
		Callers:    1,
		Load:       benchkit.Load{Ops: ops, Warmup: warmup},
		OneShot:    true,
		Contenders: syncsContenders,
		Run: func(ctx context.Context, f *benchkit.Fixture, load benchkit.Load) (*benchkit.Result, error) {
			if load.Ops <= 0 {
				load = benchkit.Load{Ops: ops, Warmup: warmup}
			}
			dir, err := os.MkdirTemp(f.Dir, "syncs-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(dir)
			if dir, err = filepath.EvalSymlinks(dir); err != nil { // as strace -y names files
				return nil, err
			}
			spec := syncsSpec{Contender: f.D.Name(), Kind: kind, Dir: dir, Stored: min(stored, syncsStored), Ops: load.Ops, Warmup: load.Warmup}
			c, err := countSyncs(ctx, spec)
			if err != nil {
				return nil, err
			}
			return c.result(spec), nil
		},
	}
}

// syncCount is what a traced process did in its window.
type syncCount struct {
	Ops     int // calls made
	perFile map[string]int
	other   map[string]int // flushes that are not fsync or fdatasync: "msync", "O_DSYNC write"…
}

// total is the number of flushes: fsync and fdatasync calls, and the
// others.
func (c *syncCount) total() int {
	n := 0
	for _, m := range []map[string]int{c.perFile, c.other} {
		for _, v := range m {
			n += v
		}
	}
	return n
}

// bboltFiles are the stores' bbolt files, whose flushes are printed apart.
var bboltFiles = []string{"idem.db", "naive.db"}

// result makes the row's result: score and metrics per call, and the note.
func (c *syncCount) result(spec syncsSpec) *benchkit.Result {
	ops := float64(max(c.Ops, 1))
	total := float64(c.total()) / ops
	r := &benchkit.Result{Ops: c.Ops, Score: total, ScoreUnit: "syncs/call",
		Metrics: []benchkit.Metric{{Value: total, Unit: "syncs/call"}}}
	var parts []string
	for _, f := range slices.Sorted(maps.Keys(c.perFile)) {
		per := float64(c.perFile[f]) / ops
		r.Metrics = append(r.Metrics, benchkit.Metric{Value: per, Unit: "syncs/call:" + f})
		label := f
		if slices.Contains(bboltFiles, f) {
			label = "bbolt " + f
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", label, per))
	}
	r.Note = fmt.Sprintf("%.2f flushes/call (strace, %d calls, then Close, Open, Close)", total, c.Ops)
	if len(parts) > 0 {
		r.Note += ": fsync+fdatasync " + strings.Join(parts, ", ")
	}
	for _, k := range slices.Sorted(maps.Keys(c.other)) {
		r.Note += fmt.Sprintf("; %s %.2f", k, float64(c.other[k])/ops)
		r.Metrics = append(r.Metrics, benchkit.Metric{Value: float64(c.other[k]) / ops, Unit: "flushes/call:" + strings.ReplaceAll(k, " ", "-")})
	}
	return r
}

// errNoTrace says strace cannot count here: a row skipped, not failed.
func errNoTrace(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{benchkit.ErrSkipped}, args...)...)
}

// countSyncs runs spec in a second process and counts its flushes from the
// moment strace is attached (after its warm-up) until it exits.
func countSyncs(ctx context.Context, spec syncsSpec) (*syncCount, error) {
	straceBin, err := exec.LookPath("strace")
	if err != nil {
		return nil, errNoTrace("strace not found (Debian: apt-get install strace)")
	}
	cmd, err := selfCommand(ctx, syncsEnv, spec)
	if err != nil {
		return nil, err
	}
	var childErr strings.Builder
	cmd.Stderr = &childErr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); err != nil || line != "ready\n" {
		return nil, fmt.Errorf("flush count's process: %q %v: %s", line, err, childErr.String())
	}
	pid := cmd.Process.Pid
	syncFiles := openSyncFiles(pid) // files it already holds open O_SYNC or O_DSYNC

	log := filepath.Join(spec.Dir, "strace.log")
	st := exec.CommandContext(ctx, straceBin, "-f", "-y", "-o", log, "-p", strconv.Itoa(pid),
		"-e", "trace=fsync,fdatasync,sync_file_range,syncfs,sync,msync,open,openat,write,pwrite64,writev,pwritev,pwritev2")
	stErr, err := st.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := st.Start(); err != nil {
		return nil, errNoTrace("strace: %v", err)
	}
	defer func() { _ = st.Process.Kill(); _ = st.Wait() }()
	// strace says "Process N attached with M threads" once it traces every
	// thread; then the calls may start.
	stLines := bufio.NewScanner(stErr)
	var said []string
	for stLines.Scan() {
		said = append(said, stLines.Text())
		if strings.Contains(stLines.Text(), "attached") {
			break
		}
	}
	if len(said) == 0 || !strings.Contains(said[len(said)-1], "attached") {
		return nil, errNoTrace("strace could not attach: %s", strings.Join(said, "; "))
	}
	drained := make(chan struct{}) // strace's stderr read to its end, as Wait wants
	go func() { _, _ = io.Copy(io.Discard, stErr); close(drained) }()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return nil, err
	}
	var res struct {
		Ops int `json:"ops"`
	}
	if err := json.NewDecoder(out).Decode(&res); err != nil {
		return nil, fmt.Errorf("flush count's process: %v: %s", err, childErr.String())
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("flush count's process: %v: %s", err, childErr.String())
	}
	<-drained // strace ends once the process has exited
	if err := st.Wait(); err != nil {
		return nil, fmt.Errorf("strace: %v", err)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		return nil, err
	}
	c := parseStrace(string(data), filepath.Join(spec.Dir, syncsStore), syncFiles)
	c.Ops = res.Ops
	return c, nil
}

// oDSync is Linux's O_DSYNC as fdinfo shows flags (octal); O_SYNC
// (0o4010000) holds it too.
const oDSync = 0o10000

// openSyncFiles lists the files process pid holds open with O_SYNC or
// O_DSYNC, from /proc/PID/fdinfo.
func openSyncFiles(pid int) map[string]bool {
	files := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, "flags:"); ok {
				if fl, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64); err == nil && fl&oDSync != 0 {
					if path, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil {
						files[path] = true
					}
				}
			}
		}
	}
	return files
}

var (
	// A call's first line: "PID name(FD<path>..." (finished or not).
	straceFdCall = regexp.MustCompile(`^\d+\s+(\w+)\(\d+<([^>]*)>`)
	// An open's first line, its path and flags.
	straceOpen = regexp.MustCompile(`^\d+\s+open(?:at)?\((?:[^,]*, )?"([^"]*)", ([A-Z0-9_|]+)`)
	// A call without a file: "PID sync(" or "PID msync(…, MS_SYNC)".
	straceNoFd = regexp.MustCompile(`^\d+\s+(sync|msync)\(`)
	digits     = regexp.MustCompile(`[0-9]+`)
)

// parseStrace counts the flushes in strace's log (-f -y): fsync and
// fdatasync per file (named relative to dir, digits folded to #; files
// elsewhere by their full path), and apart the other flushes: syncfs,
// sync_file_range, sync, msync, and writes to files opened O_SYNC or
// O_DSYNC (syncFiles, and those the log shows opened so).
func parseStrace(log, dir string, syncFiles map[string]bool) *syncCount {
	c := &syncCount{perFile: map[string]int{}, other: map[string]int{}}
	name := func(path string) string {
		if rel, err := filepath.Rel(dir, path); err == nil && !strings.HasPrefix(rel, "..") {
			return digits.ReplaceAllString(rel, "#")
		}
		return path
	}
	sync := maps.Clone(syncFiles)
	if sync == nil {
		sync = map[string]bool{}
	}
	for _, l := range strings.Split(log, "\n") {
		if m := straceOpen.FindStringSubmatch(l); m != nil {
			if strings.Contains(m[2], "O_SYNC") || strings.Contains(m[2], "O_DSYNC") {
				sync[m[1]] = true
			}
			continue
		}
		if m := straceNoFd.FindStringSubmatch(l); m != nil {
			if m[1] == "sync" || strings.Contains(l, "MS_SYNC") {
				c.other[m[1]]++
			}
			continue
		}
		m := straceFdCall.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		switch call, path := m[1], m[2]; call {
		case "fsync", "fdatasync":
			c.perFile[name(path)]++
		case "syncfs", "sync_file_range":
			c.other[call+" "+name(path)]++
		case "write", "pwrite64", "writev", "pwritev", "pwritev2":
			if sync[path] {
				c.other["O_DSYNC write "+name(path)]++
			}
		}
	}
	return c
}

// syncsChild runs a flush count's second process if syncsEnv asks for one,
// and exits: it stores the records and warms up, says "ready", waits for
// "go" (strace attached), makes the calls, closes the contender, opens and
// closes it again, and prints how many calls it made.
func syncsChild() {
	js := os.Getenv(syncsEnv)
	if js == "" {
		return
	}
	err := func() error {
		var spec syncsSpec
		if err := json.Unmarshal([]byte(js), &spec); err != nil {
			return err
		}
		i := slices.IndexFunc(Contenders(), func(c benchkit.Contender) bool { return c.Name == spec.Contender })
		if i < 0 {
			return fmt.Errorf("no contender %q", spec.Contender)
		}
		c := Contenders()[i]
		var w benchkit.Workload
		switch spec.Kind {
		case "first":
			w = benchkit.FirstWorkload(spec.Stored, 1, benchkit.Load{})
		case "dotx":
			w = benchkit.DoTxWorkload(spec.Stored, 1, benchkit.Load{})
		default:
			return fmt.Errorf("no kind %q", spec.Kind)
		}
		ctx := context.Background()
		store := filepath.Join(spec.Dir, syncsStore)
		if err := os.Mkdir(store, 0o755); err != nil {
			return err
		}
		f, err := benchkit.OpenFixture(ctx, c, store, benchkit.FixtureSpec{Stored: spec.Stored}, nil)
		if err != nil {
			return err
		}
		if spec.Warmup > 0 {
			if _, err := w.Run(ctx, f, benchkit.Load{Ops: spec.Warmup}); err != nil {
				return errors.Join(fmt.Errorf("warm-up: %w", err), f.D.Close())
			}
		}
		fmt.Println("ready")
		if line, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil || line != "go\n" {
			return errors.Join(fmt.Errorf("waiting for go: %q %v", line, err), f.D.Close())
		}
		r, err := w.Run(ctx, f, benchkit.Load{Ops: spec.Ops})
		if err = errors.Join(err, f.D.Close()); err != nil {
			return err
		}
		d, err := c.Open(ctx, store) // a catch-up left to the next Open
		if err != nil {
			return err
		}
		if err := d.Close(); err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"ops": r.Ops})
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: flush count's process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
