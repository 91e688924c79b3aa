package robustness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// rounds is n, or IDEM_ROBUST_ROUNDS when set (the long run).
func rounds(n int) int {
	if v, err := strconv.Atoi(os.Getenv("IDEM_ROBUST_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return n
}

// seed is IDEM_ROBUST_SEED when set, else a new one; the test logs it, so
// that a failing run's cuts (which writes each drops or tears, and when the
// kill comes) can be chosen again.
func seed(t *testing.T) uint64 {
	t.Helper()
	s := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("IDEM_ROBUST_SEED"), 10, 64); err == nil {
		s = v
	}
	t.Logf("seed %d (IDEM_ROBUST_SEED=%d chooses the same cuts again)", s, s)
	return s
}

// TestPowerCut runs the workload in a child on the FUSE layer, kills the child
// (SIGKILL) at a random moment, and cuts the power in each mode of cutModes:
// ordered (every write the child made since its file's last fsync dropped, or
// those after a random point), then harsh (an arbitrary subset of them kept,
// some torn at 512-byte sectors; fewer rounds in the short run). The parent
// then opens what is left, directly, and checks it (checkPowerCut).
func TestPowerCut(t *testing.T) {
	forEachCut(t, 4, 2, 1, func(t *testing.T, r *rand.Rand, cuts []cut) {
		total, st := verdict{}, cutStats{}
		for i, c := range cuts {
			a, s := powerCutRound(t, r, c, false)
			total.add(checkPowerCut(t, a))
			st.add(s)
			if t.Failed() {
				t.Fatalf("round %d (%s cut) failed", i, c)
			}
		}
		t.Logf("power cuts: %d; unsynced writes %d, dropped %d, torn %d; keys %d, acked before the cut %d; Do re-executions %d, all with Recovered: %d",
			len(cuts), st.writes, st.dropped, st.torn, total.keys, total.acked, total.reexecuted, total.recoveredSeen)
	})
}

// forEachCut runs test in a subtest per mode of cutModes, with a generator
// seeded by seed and salt, and the cuts of its rounds: rounds(ordered) of
// the ordered mode, rounds(harsh) of the harsh one (fewer: the short run).
func forEachCut(t *testing.T, ordered, harsh int, salt uint64, test func(t *testing.T, r *rand.Rand, cuts []cut)) {
	for _, m := range cutModes {
		t.Run(m.name, func(t *testing.T) {
			n := rounds(ordered)
			if m.name == "harsh" {
				n = rounds(harsh)
			}
			cuts := make([]cut, n)
			for i := range cuts {
				cuts[i] = m.cuts[i%len(m.cuts)]
			}
			test(t, rand.New(rand.NewPCG(seed(t), salt)), cuts)
		})
	}
}

// TestPowerCutCatchesNoSync is the power-cut test's negative check, in each
// mode of cutModes: with the child's bbolt commits made with NoSync (not
// durable), the same check must fail (catchNoSync).
func TestPowerCutCatchesNoSync(t *testing.T) {
	for _, m := range cutModes {
		t.Run(m.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed(t), 2))
			catchNoSync(t, m, func(c cut) afterCut { a, _ := powerCutRound(t, r, c, true); return a })
		})
	}
}

// noSyncRounds bounds the rounds of a negative check on NoSync.
const noSyncRounds = 8

// catchNoSync runs round (a child on a NoSync engine, killed, and a cut of
// mode m) and the check of what is left, in a process of its own (a torn
// file can fault bbolt's check: a crash is a failure too), until the check
// fails, at most noSyncRounds times; it fails t if the check never does. Not
// every round can fail it: bbolt syncs the file when it grows it, even on
// NoSync, and a kill just after that leaves little unsynced.
func catchNoSync(t *testing.T, m cutMode, round func(c cut) afterCut) {
	t.Helper()
	for i := range noSyncRounds {
		c := m.cuts[i%len(m.cuts)]
		failed, why := checkInChild(t, round(c))
		t.Logf("round %d (%s cut) on NoSync: check failed %t: %s", i, c, failed, why)
		if failed {
			return
		}
	}
	t.Errorf("the check failed no round of %d on NoSync (%s cuts)", noSyncRounds, m.name)
}

// afterCut is what a round left to check after its power cut: the file, and
// the child's logs (power: acks and ledger of Keys keys; history: the
// history).
type afterCut struct {
	Check        string // "power" or "history"
	DB           string
	Acks, Ledger string
	Keys         int
	History      string
}

// envAfterCut holds an afterCut in JSON for TestAfterCutChild.
const envAfterCut = "IDEM_ROBUST_AFTER_CUT"

// checkInChild runs a's check in a process of its own (this test binary,
// TestAfterCutChild) and reports whether it failed (or crashed) and the
// first line that says why.
func checkInChild(t *testing.T, a afterCut) (failed bool, why string) {
	t.Helper()
	js, err := json.Marshal(a)
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^TestAfterCutChild$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), envAfterCut+"="+string(js))
	out, err := cmd.CombinedOutput()
	if err == nil && !strings.Contains(string(out), "PASS") {
		t.Fatalf("the check's process: %s", out)
	}
	// Why: from the first report of a test file or of the runtime, without
	// testify's trace, on one line.
	text := string(out)
	if i := regexp.MustCompile(`\S+_test\.go:\d+:|panic:|fatal error|unexpected fault`).FindStringIndex(text); i != nil {
		text = text[i[0]:]
	}
	text = regexp.MustCompile(`(?s)Error Trace:.*?Error:`).ReplaceAllString(text, "")
	why = strings.Join(strings.Fields(text), " ")
	if len(why) > 240 {
		why = why[:240] + "…"
	}
	return err != nil, why
}

// TestAfterCutChild is the check of a negative round, run by checkInChild
// in a process of its own; it is skipped when run otherwise.
func TestAfterCutChild(t *testing.T) {
	js := os.Getenv(envAfterCut)
	if js == "" {
		t.Skip("skipped: run by checkInChild")
	}
	// A torn file can send bbolt's check round a cycle of pages: let it
	// overflow a small stack soon rather than a gigabyte late.
	debug.SetMaxStack(64 << 20)
	var a afterCut
	require.NoError(t, json.Unmarshal([]byte(js), &a))
	switch a.Check {
	case "power":
		checkPowerCut(t, a)
	case "history":
		checkHistory(t, a)
	default:
		t.Fatalf("no check %q", a.Check)
	}
}

// powerCutRound is one round of the power-cut test up to the cut: the
// workload in a child on the FUSE layer (its bbolt commits not synced with
// nosync), SIGKILL after a random number of answers, a power cut c.
func powerCutRound(t *testing.T, r *rand.Rand, c cut, nosync bool) (afterCut, cutStats) {
	f := mountFaultFS(t)
	f.mu.Lock()
	f.syncDelay = time.Millisecond
	f.mu.Unlock()
	dir := t.TempDir()
	a := afterCut{Check: "power", DB: filepath.Join(f.under, "idem.db"), Acks: filepath.Join(dir, "acks"),
		Ledger: filepath.Join(dir, "ledger"), Keys: 400}
	env := []string{"IDEM_DB=" + filepath.Join(f.mnt, "idem.db"), "IDEM_ACKS=" + a.Acks,
		"IDEM_LEDGER=" + a.Ledger, "IDEM_KEYS=" + strconv.Itoa(a.Keys), "IDEM_NOSYNC=" + os.Getenv("IDEM_ROBUST_NOSYNC")}
	want := r.IntN(a.Keys) // kill after a random number of answers, 0 to about n
	if nosync {
		env = append(env, "IDEM_NOSYNC=1")
		want = a.Keys/8 + r.IntN(a.Keys/2) // some answers to lose
	}
	cmd := child(t, "workload", env...)
	require.NoError(t, cmd.Start())
	for deadline := time.Now().Add(20 * time.Second); len(readAcks(t, a.Acks)) < want && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	return a, f.powerCut(t, r, c)
}

// checkPowerCut checks what a power-cut round left: bbolt's consistency
// check passes, every answer a caller got replays unchanged, every DoTx
// effect committed exactly once, and a Do re-executed only with Recovered
// set.
func checkPowerCut(t testing.TB, a afterCut) verdict {
	t.Helper()
	boltkit.Check(t, a.DB)
	e, err := idem.Open(a.DB, &idem.Options{PruneInterval: -1})
	require.NoError(t, err, "the file opens after the power cut")
	l, err := openLedger(a.Ledger)
	require.NoError(t, err)
	v := checkWorkload(t, e, l, a.Ledger, readAcks(t, a.Acks), a.Keys)
	require.NoError(t, e.Close())
	boltkit.Check(t, a.DB)
	return v
}

// TestFsyncAndWriteErrorsFailClosed fails the file's fsyncs (then, in a
// second case, its writes) under a live engine on the FUSE layer (in a child:
// see scriptChild): the call whose commit fails gets ErrStorageFailed
// wrapping the EIO, and every later call fails closed with ErrStorageFailed,
// even once the disk works again, until the engine is closed and reopened;
// then, after a power cut (each mode of cutModes: all of what the failed
// commit wrote dropped, or a harsh subset of it kept), every answer given
// before the failure replays.
func TestFsyncAndWriteErrorsFailClosed(t *testing.T) {
	for _, tc := range []struct {
		name          string
		writes, syncs bool
		mode          cutMode
	}{
		{"fsync fails", false, true, cutModes[0]}, {"write fails", true, false, cutModes[0]},
		{"fsync fails harsh", false, true, cutModes[1]}, {"write fails harsh", true, false, cutModes[1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed(t), 4))
			f := mountFaultFS(t)
			cmd := child(t, "script", "IDEM_DB="+filepath.Join(f.mnt, "idem.db"))
			in, err := cmd.StdinPipe()
			require.NoError(t, err)
			outPipe, err := cmd.StdoutPipe()
			require.NoError(t, err)
			cmd.Stderr = os.Stderr
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) // before the unmount
			out := bufio.NewReader(outPipe)
			send := func(line string) string {
				_, err := fmt.Fprintln(in, line)
				require.NoError(t, err)
				answer, err := out.ReadString('\n')
				require.NoError(t, err, "the child answers %q", line)
				return answer
			}
			for _, k := range []string{"a", "b", "c"} {
				require.Equal(t, "ok replayed=false ran="+strconv.Itoa(int(k[0]-'a'+1))+"\n", send("do "+k))
			}
			f.set(tc.writes, tc.syncs)
			a := send("do lost")
			require.Contains(t, a, "is:ErrStorageFailed")
			require.Contains(t, a, "input/output error", "the cause, EIO, is kept")
			f.set(false, false)
			require.Contains(t, send("do a"), "is:ErrStorageFailed", "failed closed: even a replay, with the disk back")
			require.Contains(t, send("do new"), "is:ErrStorageFailed")
			require.Contains(t, send("dotx tx"), "is:ErrStorageFailed")
			a = send("do lost")
			require.Contains(t, a, "is:ErrStorageFailed")
			require.Contains(t, a, "ran=3", "fn never ran for a call whose started record did not commit")
			send("close")
			require.NoError(t, in.Close())
			require.NoError(t, cmd.Wait())

			f.powerCut(t, r, tc.mode.cuts[0])
			path := filepath.Join(f.under, "idem.db")
			boltkit.Check(t, path)
			ctx := context.Background()
			e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
			require.NoError(t, err)
			defer e.Close()
			for _, k := range []string{"a", "b", "c"} {
				res, err := e.Do(ctx, k, nil, mustNotRun(t))
				require.NoError(t, err)
				require.True(t, res.Replayed, "answers given before the failure are on disk")
			}
			res, err := e.Do(ctx, "lost", nil, func(context.Context) ([]byte, error) { return []byte("v"), nil })
			require.NoError(t, err, "works again after a reopen")
			require.False(t, res.Replayed)
		})
	}
}
