package pgtest

import (
	"bytes"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Proxy is a TCP proxy in front of a real server that cuts a connection
// around a chosen statement, so that the client never hears how it ended:
// the ambiguous COMMIT of a dropped connection, made on purpose. It cuts the
// first connection whose client sends bytes containing the armed marker, in
// one of three ways (CutAfter, CutAtOnce, CutDelayed), and records what
// every client sends after the cut (SentAfterCut).
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	marker  []byte  // cut the connection that sends this
	mode    cutMode // how
	cut     int     // connections cut so far
	after   []byte  // what clients sent after the first cut
	delayed *pconn  // CutDelayed: the cut connection whose marked bytes wait
	held    []byte  // … and those bytes

	dropCancels bool // DropCancelRequests
}

// cutMode is how the proxy cuts the marked connection.
type cutMode int

const (
	// cutAfterAnswer forwards the marked bytes and closes the connection
	// when the server answers them: the statement ran, its answer is lost.
	cutAfterAnswer cutMode = iota
	// cutAtOnce forwards the marked bytes and closes both sides at once:
	// the server reads them before it sees the end of the connection.
	cutAtOnce
	// cutBefore closes both sides instead of forwarding the marked bytes:
	// the statement never reaches the server.
	cutBefore
	// cutDelayed closes the client's side at once and holds the marked
	// bytes; they reach the server (on the old server connection, still
	// open) only after another connection's next statement was executed
	// and answered: a COMMIT that arrives late, after the client gave up
	// on it and read back.
	cutDelayed
	// cutHeld is cutDelayed with the marked bytes never delivered: the
	// server connection stays open, its transaction idle until the server
	// ends it.
	cutHeld
)

// pconn is one proxied connection.
type pconn struct {
	client, server net.Conn
	detached       atomic.Bool // CutDelayed: the client is gone, the server side waits
	flushed        atomic.Bool // … and its held bytes were sent
	armed          atomic.Bool // sent a statement while bytes were held elsewhere
}

// NewProxy listens on a loopback port and forwards to target (host:port);
// it stops when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target}
	var (
		wg    sync.WaitGroup
		cmu   sync.Mutex
		conns []*pconn
	)
	t.Cleanup(func() {
		ln.Close()
		cmu.Lock()
		for _, c := range conns {
			c.client.Close()
			c.server.Close()
		}
		cmu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			pc := &pconn{client: c, server: server}
			cmu.Lock()
			conns = append(conns, pc)
			cmu.Unlock()
			wg.Go(func() { p.serve(pc) })
		}
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// CutAfter arms the proxy: the next connection whose client sends bytes
// containing marker has them forwarded, and is closed once the server has
// answered them: the statement ran, and the client never hears of it.
func (p *Proxy) CutAfter(marker string) { p.arm(marker, cutAfterAnswer) }

// CutAtOnce arms the proxy: the next connection whose client sends bytes
// containing marker has them forwarded and is closed at once, both sides:
// the server reads the bytes, then the end of the connection.
func (p *Proxy) CutAtOnce(marker string) { p.arm(marker, cutAtOnce) }

// CutBefore arms the proxy: the next connection whose client sends bytes
// containing marker is closed, both sides, and the bytes are dropped: the
// server never reads them, and rolls back the connection's transaction.
func (p *Proxy) CutBefore(marker string) { p.arm(marker, cutBefore) }

// CutDelayed arms the proxy: the next connection whose client sends bytes
// containing marker has the bytes before them forwarded and its client's
// side closed at once; the marked bytes reach the server, on the same
// server connection, only once another connection has sent a statement
// and had the answer of its execution (CommandComplete or an error): a
// COMMIT that arrives after the client's read-back.
func (p *Proxy) CutDelayed(marker string) { p.arm(marker, cutDelayed) }

// CutHeld arms the proxy as CutDelayed does, except that the marked bytes
// never reach the server: the server connection stays open and idle, its
// transaction in progress until the server ends it (a COMMIT lost on its
// way, on a connection the server still believes alive).
func (p *Proxy) CutHeld(marker string) { p.arm(marker, cutHeld) }

func (p *Proxy) arm(marker string, mode cutMode) {
	p.mu.Lock()
	p.marker, p.mode = []byte(marker), mode
	p.mu.Unlock()
}

// DropCancelRequests makes the proxy drop every cancel request (the
// protocol's CancelRequest, which a client sends on a connection of its
// own): pgx sends one when it closes a connection whose read failed, and
// if it reaches the server while the cut connection's COMMIT runs, it may
// cancel the COMMIT. Dropping them makes a cut COMMIT's outcome certain.
func (p *Proxy) DropCancelRequests() {
	p.mu.Lock()
	p.dropCancels = true
	p.mu.Unlock()
}

// Cut returns how many connections the proxy has cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

// SentAfterCut returns every byte clients sent after the first cut, in the
// order the proxy read them (connections interleaved).
func (p *Proxy) SentAfterCut() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.after...)
}

// flushDelayed sends the held bytes of a CutDelayed connection.
func (p *Proxy) flushDelayed() {
	p.mu.Lock()
	d, held := p.delayed, p.held
	p.delayed, p.held = nil, nil
	p.mu.Unlock()
	if d != nil {
		d.flushed.Store(true)
		if _, err := d.server.Write(held); err != nil {
			d.server.Close()
		}
	}
}

func (p *Proxy) serve(c *pconn) {
	doomed := make(chan struct{})
	var once sync.Once
	closeBoth := func() { once.Do(func() { c.client.Close(); c.server.Close() }) }
	go func() {
		buf := make([]byte, 64<<10)
		for first := true; ; first = false {
			n, err := c.client.Read(buf)
			if n > 0 {
				data := buf[:n]
				p.mu.Lock()
				if first && p.dropCancels && cancelRequest(data) {
					p.mu.Unlock()
					closeBoth()
					return
				}
				at := -1
				if p.marker != nil {
					at = bytes.Index(data, p.marker)
				}
				mode := p.mode
				if p.cut > 0 {
					p.after = append(p.after, data...)
				}
				if at >= 0 {
					p.marker = nil
					p.cut++
				}
				if at < 0 && p.delayed != nil && p.delayed != c && statement(data) {
					c.armed.Store(true)
				}
				if at >= 0 && mode == cutBefore {
					p.mu.Unlock()
					closeBoth()
					return
				}
				if at >= 0 && (mode == cutDelayed || mode == cutHeld) {
					// Forward what precedes the marked message, hold the
					// rest, and leave the server side open.
					start := messageStart(data, at)
					if mode == cutDelayed {
						p.delayed, p.held = c, append([]byte(nil), data[start:]...)
					}
					c.detached.Store(true)
					p.mu.Unlock()
					if start > 0 {
						_, _ = c.server.Write(data[:start])
					}
					c.client.Close()
					return
				}
				p.mu.Unlock()
				if _, werr := c.server.Write(data); werr != nil {
					closeBoth()
					return
				}
				if at >= 0 {
					if mode == cutAtOnce {
						closeBoth()
						return
					}
					close(doomed)
				}
			}
			if err != nil {
				if !c.detached.Load() {
					closeBoth()
				}
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			if c.detached.Load() {
				if c.flushed.Load() {
					c.server.Close() // the late bytes were answered
					return
				}
				continue // the client is gone: nothing to forward
			}
			select {
			case <-doomed:
				closeBoth() // the server answered the marked statement: cut
				return
			default:
			}
			if _, werr := c.client.Write(buf[:n]); werr != nil {
				closeBoth()
				return
			}
			if completes(buf[:n]) && c.armed.CompareAndSwap(true, false) {
				p.flushDelayed()
			}
		}
		if err != nil {
			if !c.detached.Load() {
				closeBoth()
			} else {
				c.server.Close()
			}
			return
		}
	}
}

// statement reports whether data, a client's write, begins with a message
// that runs a statement (the protocol's Query, Parse or Bind), not a
// connection's startup.
func statement(data []byte) bool {
	return len(data) > 0 && (data[0] == 'Q' || data[0] == 'P' || data[0] == 'B')
}

// cancelRequest reports whether data, a connection's first bytes, is a
// CancelRequest: length 16, then the code 80877102.
func cancelRequest(data []byte) bool {
	return len(data) >= 8 && bytes.Equal(data[:8], []byte{0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e})
}

// completes reports whether data, a server's write, holds the end of a
// statement's execution: a CommandComplete ('C') or ErrorResponse ('E')
// message (a Parse's answer, when pgx prepares a statement, holds neither).
func completes(data []byte) bool {
	for i := 0; i+5 <= len(data); {
		if data[i] == 'C' || data[i] == 'E' {
			return true
		}
		n := int(data[i+1])<<24 | int(data[i+2])<<16 | int(data[i+3])<<8 | int(data[i+4])
		if n < 4 {
			return false
		}
		i += 1 + n
	}
	return false
}

// messageStart returns the offset of the protocol message in data that
// contains offset at: messages are a type byte and a 4-byte big-endian
// length that counts itself. Bytes that do not parse as messages give 0.
func messageStart(data []byte, at int) int {
	for i := 0; i+5 <= len(data); {
		n := int(data[i+1])<<24 | int(data[i+2])<<16 | int(data[i+3])<<8 | int(data[i+4])
		if n < 4 {
			return 0
		}
		if at < i+1+n {
			return i
		}
		i += 1 + n
	}
	return 0
}

// ProxiedConfig is the pool configuration of the server in env (see DSN),
// with its host and port those of a new Proxy in front of it, and the
// Proxy, closed when t ends.
func ProxiedConfig(t testing.TB, env string) (*pgxpool.Config, *Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DSN(t, env))
	if err != nil {
		t.Fatal(err)
	}
	proxy := NewProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	return cfg, proxy
}
