package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemkit/idem/idemcore"
)

// The admin handler's routes over the outbox: list, get, retry and drop dead letters.

func (a *admin) listMessages(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	state := q.Get("state")
	switch state {
	case "":
		state = "all"
	case "all", "pending", "dead":
	default:
		return adminBadRequest(fmt.Sprintf("state must be pending, dead or all, not %q", state))
	}
	limit := 0
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return adminBadRequest(fmt.Sprintf("limit must be a non-negative integer, not %q", s))
		}
		limit = n
	}
	_, byTopic := q["topic"]
	topic := q.Get("topic")
	out := AdminMessages{Messages: []AdminMessage{}, Corrupt: []AdminCorrupt{}}
	err := a.op.Messages(func(m *idemcore.Message, merr error) error {
		switch {
		case state == "pending" && m.Dead, state == "dead" && !m.Dead:
		case merr != nil && errors.Is(merr, idemcore.ErrCorrupt):
			out.Corrupt = append(out.Corrupt, AdminCorrupt{Seq: m.Seq, Dead: m.Dead})
		case merr != nil:
			return merr
		case !byTopic || m.Topic == topic:
			out.Matched++
			if limit == 0 || len(out.Messages) < limit {
				out.Messages = append(out.Messages, a.message(m))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, out)
}

// adminPathSeq parses the {seq} path segment.
func adminPathSeq(r *http.Request) (uint64, error) {
	s := r.PathValue("seq")
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 {
		return 0, adminBadRequest(fmt.Sprintf("%q is not a message sequence number (a positive integer)", s))
	}
	return seq, nil
}

// adminErrStop ends a walk of the messages early.
var adminErrStop = errors.New("stop")

func (a *admin) getMessage(w http.ResponseWriter, r *http.Request) error {
	seq, err := adminPathSeq(r)
	if err != nil {
		return err
	}
	var found *idemcore.Message
	err = a.op.Messages(func(m *idemcore.Message, merr error) error {
		if m.Seq != seq {
			return nil
		}
		if merr != nil {
			return merr
		}
		found = m
		return adminErrStop
	})
	switch {
	case errors.Is(err, adminErrStop):
	case err != nil:
		return err
	case found == nil:
		return fmt.Errorf("%w: message %d (delivered, dropped, expired or never enqueued)", idemcore.ErrMessageNotFound, seq)
	}
	return adminWriteJSON(w, http.StatusOK, a.message(found))
}

func (a *admin) retryDead(w http.ResponseWriter, r *http.Request) error {
	return a.operateDead(w, r, "retry", a.op.RetryDead)
}

func (a *admin) dropDead(w http.ResponseWriter, r *http.Request) error {
	return a.operateDead(w, r, "drop", a.op.DropDead)
}

func (a *admin) operateDead(w http.ResponseWriter, r *http.Request, name string, do func(uint64) error) error {
	seq, err := adminPathSeq(r)
	if err != nil {
		return err
	}
	if err := do(seq); err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, adminDeadOp{Op: name, Seq: seq})
}

// message renders m, with its payload only under ShowResponses.
func (a *admin) message(m *idemcore.Message) AdminMessage {
	return NewAdminMessage(m, 0, a.opts.ShowResponses)
}

// AdminMessages is the answer of GET /outbox: the messages that pass the
// filter (pending in enqueue order, then dead letters by Seq), at most limit
// of them; Matched counts all that pass it. Corrupt lists the messages that
// fail to decode (in the state asked for, whatever the topic).
type AdminMessages struct {
	Messages []AdminMessage `json:"messages"`
	Matched  int            `json:"matched"`
	Corrupt  []AdminCorrupt `json:"corrupt"`
}

// AdminCorrupt names a message that fails to decode.
type AdminCorrupt struct {
	Seq  uint64 `json:"seq"`
	Dead bool   `json:"dead"`
}

// adminDeadOp is the answer of retry and drop.
type adminDeadOp struct {
	Op  string `json:"op"` // "retry" or "drop"
	Seq uint64 `json:"seq"`
}
