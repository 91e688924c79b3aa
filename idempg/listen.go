package idempg

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listener holds one connection of its own that LISTENs on the schema's
// channels: record changes wake the waiters of their key, enqueues wake the
// dispatcher. If the connection fails it reconnects after a poll period;
// meanwhile waiters poll (WaitChange's timer), so a lost notification costs
// at most one poll period.
type listener struct {
	cfg     *pgx.ConnConfig
	records string // channel of record changes; payload: the key
	outbox  string // channel of enqueues
	wake    func() // called on an enqueue elsewhere
	poll    time.Duration

	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

func newListener(pool *pgxpool.Pool, s *settings, wake func()) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{
		cfg:     pool.Config().ConnConfig.Copy(),
		records: s.channel(),
		outbox:  s.channel() + "_outbox",
		wake:    wake,
		poll:    s.PollInterval,
		subs:    map[string]map[chan struct{}]struct{}{},
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	go l.run(ctx)
	return l
}

// subscribe returns a channel closed on the next change of key's record
// notified from now on, and the function that unsubscribes it.
func (l *listener) subscribe(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	l.mu.Lock()
	m := l.subs[key]
	if m == nil {
		m = map[chan struct{}]struct{}{}
		l.subs[key] = m
	}
	m[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if m, ok := l.subs[key]; ok {
			if _, ok := m[ch]; ok {
				delete(m, ch)
				if len(m) == 0 {
					delete(l.subs, key)
				}
			}
		}
	}
}

// notify wakes every subscriber of key.
func (l *listener) notify(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.subs[key] {
		close(ch)
	}
	delete(l.subs, key)
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	for ctx.Err() == nil {
		l.listen(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(l.poll):
		}
	}
}

// listen connects, LISTENs and dispatches notifications until the
// connection fails or ctx ends.
func (l *listener) listen(ctx context.Context) {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.records}.Sanitize()+"; LISTEN "+pgx.Identifier{l.outbox}.Sanitize()); err != nil {
		return
	}
	// A change may have been notified while no connection listened.
	l.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		if n.Channel == l.outbox {
			l.wake()
			continue
		}
		l.notify(n.Payload)
	}
}

// wakeAll wakes every subscriber and the dispatcher: they read again.
func (l *listener) wakeAll() {
	l.mu.Lock()
	for key, m := range l.subs {
		for ch := range m {
			close(ch)
		}
		delete(l.subs, key)
	}
	l.mu.Unlock()
	l.wake()
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}
