package robustness

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
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

// TestPowerCut runs the workload in a child on the FUSE layer, kills the child
// (SIGKILL) at a random moment, and cuts the power: every write the child
// made since its file's last fsync is dropped (all of them, or, torn, those
// after a random point). The parent then opens what is left, directly, and
// checks it: bbolt's consistency check passes, every answer a caller got
// replays unchanged, every DoTx effect committed exactly once, and a Do
// re-executed only with Recovered set.
func TestPowerCut(t *testing.T) {
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	total := verdict{}
	dropped := 0
	for round := range rounds(4) {
		f := mountFaultFS(t)
		f.mu.Lock()
		f.syncDelay = time.Millisecond
		f.mu.Unlock()
		dir := t.TempDir()
		ackPath, ledgerPath := filepath.Join(dir, "acks"), filepath.Join(dir, "ledger")
		const n = 400
		cmd := child(t, "workload", "IDEM_DB="+filepath.Join(f.mnt, "idem.db"), "IDEM_ACKS="+ackPath,
			"IDEM_LEDGER="+ledgerPath, "IDEM_KEYS="+strconv.Itoa(n), "IDEM_NOSYNC="+os.Getenv("IDEM_ROBUST_NOSYNC"))
		require.NoError(t, cmd.Start())
		// Kill after a random number of answers, 0 to about n.
		want := r.IntN(n)
		for deadline := time.Now().Add(20 * time.Second); len(readAcks(t, ackPath)) < want && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		dropped += f.powerCut(t, r, round%2 == 1)

		path := filepath.Join(f.under, "idem.db")
		boltkit.Check(t, path)
		e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
		require.NoError(t, err, "round %d: the file opens after the power cut", round)
		l, err := openLedger(ledgerPath)
		require.NoError(t, err)
		v := checkWorkload(t, e, l, ledgerPath, readAcks(t, ackPath), n)
		require.NoError(t, e.Close())
		boltkit.Check(t, path)
		total.acked += v.acked
		total.keys += v.keys
		total.reexecuted += v.reexecuted
		total.recoveredSeen += v.recoveredSeen
		if t.Failed() {
			t.Fatalf("round %d failed", round)
		}
	}
	t.Logf("power cuts: %d; unsynced writes dropped: %d; keys %d, acked before the cut %d; Do re-executions %d, all with Recovered: %d",
		rounds(4), dropped, total.keys, total.acked, total.reexecuted, total.recoveredSeen)
}

// TestFsyncAndWriteErrorsFailClosed fails the file's fsyncs (then, in a
// second case, its writes) under a live engine on the FUSE layer (in a child:
// see scriptChild): the call whose commit fails gets ErrStorageFailed
// wrapping the EIO, and every later call fails closed with ErrStorageFailed,
// even once the disk works again, until the engine is closed and reopened;
// then, after a power cut that drops whatever the failed commit wrote, every
// answer given before the failure replays.
func TestFsyncAndWriteErrorsFailClosed(t *testing.T) {
	for _, tc := range []struct {
		name          string
		writes, syncs bool
	}{{"fsync fails", false, true}, {"write fails", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
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

			f.powerCut(t, rand.New(rand.NewPCG(1, 2)), false)
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
