package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Cluster is a private PostgreSQL server that one test starts, restarts and
// kills as it likes: a fresh cluster (initdb) in a directory of its own,
// listening on a free loopback port, stopped and removed when the test
// ends. It never touches the shared server of Env (scripts/postgres.sh),
// which other tests and other people use. As root the server runs as the
// postgres user (Debian's package creates it; PostgreSQL refuses root).
//
// Without PostgreSQL installed a test is skipped with a message when run by
// hand, and fails when CI is set (.ci/run installs it).
type Cluster struct {
	t    testing.TB
	bin  string // PostgreSQL's bin directory
	dir  string // the cluster's directory: data/, logs, sockets
	port int
	cred *syscall.Credential // nil unless root

	bouncer     *exec.Cmd // nil until StartBouncer
	bouncerPort int
}

// NewCluster initialises and starts a private server; it is stopped (an
// immediate shutdown) and its directory removed when t ends. fsync is off:
// the faults these tests make are of processes and connections (a server
// killed and restarted, a PgBouncer killed), not of the machine, so what the
// server wrote survives in the page cache; scripts/postgres.sh's shared
// server keeps fsync on for the benchmarks.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := binDir()
	if bin == "" {
		missing(t, "PostgreSQL (/usr/lib/postgresql/*/bin/pg_ctl)", "apt-get install -y postgresql")
	}
	c := &Cluster{t: t, bin: bin, port: freePort(t)}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the postgres user (apt-get install postgresql creates it): %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "idem-pg-private-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		c.StopBouncer()
		_ = c.ctl("-m", "immediate", "-w", "stop")
		_ = os.RemoveAll(dir)
	})
	if out, err := c.run(filepath.Join(bin, "initdb"), "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.Start()
	return c
}

// missing skips t (by hand) or fails it (CI) for a program not installed.
func missing(t testing.TB, what, install string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set and %s is not installed: %s", what, install)
	}
	t.Skipf("%s is not installed: %s", what, install)
}

// binDir returns the newest installed PostgreSQL's bin directory, or "".
func binDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a < b
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_ctl")); err == nil {
			return dirs[i]
		}
	}
	return ""
}

// freePort returns a loopback port that nothing listened on a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// command returns cmd with args, run as the servers' owner.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = c.dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// run runs name with args as the servers' owner and returns its output.
func (c *Cluster) run(name string, args ...string) ([]byte, error) {
	return c.command(name, args...).CombinedOutput()
}

// ctl runs pg_ctl on the cluster with args.
func (c *Cluster) ctl(args ...string) error {
	out, err := c.run(filepath.Join(c.bin, "pg_ctl"), append([]string{"-D", c.data()}, args...)...)
	if err != nil {
		return fmt.Errorf("pg_ctl %v: %v\n%s", args, err, out)
	}
	return nil
}

// Addr is the server's host:port.
func (c *Cluster) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)) }

// DSN is the server's DSN, as the postgres superuser.
func (c *Cluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Start starts the stopped server and waits until it accepts connections.
func (c *Cluster) Start() {
	c.t.Helper()
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c max_connections=100 -c shared_buffers=32MB", c.port, c.dir)
	if err := c.ctl("-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		c.t.Fatalf("%v\n%s", err, log)
	}
}

// Stop stops the server: mode "immediate" kills it (every session dies
// mid-transaction, and the next Start recovers from the WAL, as after a
// crash); "fast" rolls back the open transactions and shuts down cleanly.
func (c *Cluster) Stop(mode string) {
	c.t.Helper()
	if err := c.ctl("-m", mode, "-w", "-t", "60", "stop"); err != nil {
		c.t.Fatal(err)
	}
}

// Restart is Stop(mode), then Start.
func (c *Cluster) Restart(mode string) {
	c.t.Helper()
	c.Stop(mode)
	c.Start()
}

// StartBouncer starts a private PgBouncer in transaction pooling mode in
// front of the server (on a port of its own, kept across restarts) and
// returns its DSN; it is killed when the test ends. A pool on it needs
// idempg's PollOnly and QueryExecModeExec, as with BouncerEnv.
func (c *Cluster) StartBouncer() string {
	c.t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			missing(c.t, "PgBouncer", "apt-get install -y pgbouncer")
		}
		bin = "/usr/sbin/pgbouncer"
	}
	if c.bouncerPort == 0 {
		c.bouncerPort = freePort(c.t)
	}
	ini := filepath.Join(c.dir, "pgbouncer.ini")
	conf := fmt.Sprintf(`[databases]
postgres = host=127.0.0.1 port=%d dbname=postgres user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 200
default_pool_size = 20
logfile = %s
`, c.port, c.bouncerPort, filepath.Join(c.dir, "userlist.txt"), filepath.Join(c.dir, "pgbouncer.log"))
	for name, body := range map[string]string{ini: conf, filepath.Join(c.dir, "userlist.txt"): `"postgres" ""` + "\n"} {
		if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
	cmd := c.command(bin, ini)
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("pgbouncer: %v", err)
	}
	c.bouncer = cmd
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.bouncerPort))
	for i := 0; ; i++ {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			break
		}
		if i == 600 { // 60 s: a bound on a hang, not a timing claim
			log, _ := os.ReadFile(filepath.Join(c.dir, "pgbouncer.log"))
			c.t.Fatalf("PgBouncer does not listen on %s: %v\n%s", addr, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", addr)
}

// KillBouncer kills PgBouncer with SIGKILL and waits for it: every client
// connection and every server connection it held dies at once, the latter
// mid-transaction for the clients inside one (the server rolls those back).
func (c *Cluster) KillBouncer() {
	c.t.Helper()
	if c.bouncer == nil {
		c.t.Fatal("no PgBouncer running")
	}
	_ = c.bouncer.Process.Kill()
	_ = c.bouncer.Wait()
	c.bouncer = nil
}

// StopBouncer kills PgBouncer if it runs.
func (c *Cluster) StopBouncer() {
	if c.bouncer != nil {
		_ = c.bouncer.Process.Kill()
		_ = c.bouncer.Wait()
		c.bouncer = nil
	}
}
