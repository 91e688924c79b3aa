package pgtest

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a real server that can cut a connection
// right after the server answered a chosen statement: the statement (and
// its COMMIT) ran, and the client never hears of it. That is the ambiguous
// COMMIT of a dropped connection, made on purpose.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	marker []byte // cut the connection that sends this, after its answer
	cut    int    // connections cut so far
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
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c) })
		}
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// CutAfter arms the proxy: the next connection whose client sends bytes
// containing marker has them forwarded, and is closed once the server has
// answered them.
func (p *Proxy) CutAfter(marker string) {
	p.mu.Lock()
	p.marker = []byte(marker)
	p.mu.Unlock()
}

// Cut returns how many connections the proxy has cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

func (p *Proxy) serve(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	doomed := make(chan struct{})
	var once sync.Once
	closeBoth := func() { once.Do(func() { client.Close(); server.Close() }) }
	go func() {
		defer closeBoth()
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				p.mu.Lock()
				hit := p.marker != nil && bytes.Contains(buf[:n], p.marker)
				if hit {
					p.marker = nil
					p.cut++
				}
				p.mu.Unlock()
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
				if hit {
					close(doomed)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer closeBoth()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			select {
			case <-doomed:
				return // the server answered the marked statement: cut
			default:
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}
