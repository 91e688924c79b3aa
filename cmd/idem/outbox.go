package main

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// maxErrWidth is the runes of a message's last error shown in a table; the
// JSON output and outbox get have all of it.
const maxErrWidth = 60

func newOutboxCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "outbox",
		Short: "List, show, retry and drop outbox messages",
		Long: `outbox works on the messages that DoTx calls enqueued: the pending ones, which
the program's dispatcher delivers, and the dead letters, which failed their
last attempt and wait for an operator to retry or drop them. A message is
named by its sequence number (SEQ), unique in the file.

The tool registers no handlers and delivers nothing: a retried dead letter is
delivered by the program once it runs its dispatcher again.
Each dead letter carries the dead-letter retention it died under: which have
expired is read from the file. --dead-letter-retention can only lengthen that.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	c.PersistentFlags().DurationVar(&a.deadLetterRetention, "dead-letter-retention", 0, deadLetterRetentionUsage)
	c.AddCommand(newOutboxLsCmd(a), newOutboxGetCmd(a), newOutboxRetryCmd(a), newOutboxDropCmd(a))
	for _, sub := range c.Commands() {
		sub.Args = usageArgs(sub.Args)
	}
	return c
}

func newOutboxLsCmd(a *app) *cobra.Command {
	var dead bool
	var topic string
	var limit int
	c := &cobra.Command{
		Use:   "ls [--dead] [--topic T] [--limit N]",
		Short: "List the pending messages in enqueue order, or the dead letters",
		Long: `outbox ls lists the pending messages in enqueue order (the order of delivery
within an ordering key): sequence number, topic, downstream key, ordering
key, failed attempts so far, when the next attempt may run ("-": at once),
the last attempt's error (cut to 60 characters; --json has all of it) and the
payload's size. --dead lists the dead letters instead, by sequence number,
with when they died and when they expire. Payloads are not printed: see
outbox get. Messages that fail to decode are named by sequence number on
stderr (a corrupt dead letter can still be dropped).`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return a.outboxLs(dead, topic, limit) },
	}
	c.Flags().BoolVar(&dead, "dead", false, "list the dead letters instead of the pending messages")
	c.Flags().StringVar(&topic, "topic", "", "list only the messages of this topic")
	c.Flags().IntVar(&limit, "limit", 0, "list at most this many messages (0: all)")
	return c
}

func newOutboxGetCmd(a *app) *cobra.Command {
	var raw bool
	c := &cobra.Command{
		Use:   "get SEQ",
		Short: "Show one message, pending or dead, with its payload",
		Long: `outbox get shows message SEQ, pending or dead: its fields as in outbox ls, its
whole last error, and its payload. --raw writes only the payload bytes, as
stored. With --json the payload is a string: UTF-8 text as is, other bytes in
base64 (payload_encoding says which); null when the payload is nil, which
differs from an empty one.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			seqs, err := parseSeqs(args)
			if err != nil {
				return err
			}
			return a.outboxGet(seqs[0], raw)
		},
	}
	c.Flags().BoolVar(&raw, "raw", false, "write only the payload bytes to stdout")
	return c
}

func newOutboxRetryCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "retry SEQ...",
		Short: "Put dead letters back in the outbox, their attempts reset",
		Long: `outbox retry puts each dead letter SEQ back in the outbox at its old place,
its attempt count reset to 0: it is delivered again, before the later
messages of its ordering key, once the program runs its dispatcher. A SEQ
that is not a dead letter (pending, delivered, dropped, expired or never
enqueued) is reported and the others are still retried; the exit status is
then 1.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error { return a.outboxOperate(args, retryOp) },
	}
}

func newOutboxDropCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "drop SEQ...",
		Short: "Delete dead letters: they are never delivered",
		Long: `outbox drop deletes each dead letter SEQ, also one that fails to decode: it
is never delivered. A SEQ that is not a dead letter is reported and the
others are still dropped; the exit status is then 1. Pending messages cannot
be dropped.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error { return a.outboxOperate(args, dropOp) },
	}
}

// messageJSON is an outbox message in JSON output: idemhttp's JSON form of
// a message, the admin handler's too (outbox get shows the payload, outbox
// ls its size only).
type messageJSON = idemhttp.AdminMessage

// messageJSON renders m, with its payload if show (and the server does not
// hide it, with --url), and a dead letter's expiry under
// --dead-letter-retention.
func (a *app) messageJSON(m *idem.Message, show bool) messageJSON {
	out := idemhttp.NewAdminMessage(m, a.deadLetterRetention, show)
	if n, ok := a.hiddenPayload(m.Seq); ok {
		out.PayloadSize, out.Payload, out.PayloadEncoding, out.PayloadHidden = &n, nil, "", true
	}
	return out
}

type outboxLsJSON struct {
	Dead     bool          `json:"dead"` // the list is of dead letters
	Messages []messageJSON `json:"messages"`
	// Matched counts the messages that pass the filter, listed or not.
	Matched int `json:"matched"`
	// Corrupt are the sequence numbers of the messages (pending, or dead
	// with --dead) that fail to decode: not listed, whatever the filter.
	Corrupt []uint64 `json:"corrupt"`
	// Others counts the messages of the kind not listed (the dead letters,
	// or with --dead the pending messages) that pass the topic filter.
	Others int `json:"others"`
}

// deadLetterRetentionUsage is the help of --dead-letter-retention.
const deadLetterRetentionUsage = "keep dead letters at least this long (0: each one's own retention, recorded in the file; a shorter value changes nothing)"

func (a *app) checkDeadLetterRetention() error {
	if a.deadLetterRetention < 0 {
		return &usageError{fmt.Errorf("--dead-letter-retention must not be negative, not %v", a.deadLetterRetention)}
	}
	return nil
}

// openOutbox is openOperator for the outbox commands, after their
// --dead-letter-retention is checked.
func (a *app) openOutbox() (operator, error) {
	if err := a.checkDeadLetterRetention(); err != nil {
		return nil, err
	}
	return a.openOperator()
}

func (a *app) outboxLs(dead bool, topic string, limit int) (err error) {
	if err := checkLimit(limit); err != nil {
		return err
	}
	e, err := a.openOutbox()
	if err != nil {
		return err
	}
	defer closeEngine(e, &err)

	out := outboxLsJSON{Dead: dead, Messages: []messageJSON{}, Corrupt: []uint64{}}
	err = e.Messages(func(m *idem.Message, merr error) error {
		switch {
		case m.Dead != dead:
			if merr == nil && (topic == "" || m.Topic == topic) {
				out.Others++
			}
		case merr != nil && errors.Is(merr, idem.ErrCorrupt):
			out.Corrupt = append(out.Corrupt, m.Seq)
		case merr != nil:
			return merr
		case topic == "" || m.Topic == topic:
			out.Messages = append(out.Messages, a.messageJSON(m, false))
		}
		return nil
	})
	if err != nil {
		return err
	}
	out.Messages, out.Matched = firstOf(out.Messages, limit)
	if a.json {
		return a.printJSON(out)
	}
	return a.printMessages(&out, topic)
}

func (a *app) printMessages(out *outboxLsJSON, topic string) error {
	if len(out.Corrupt) > 0 {
		seqs := make([]string, len(out.Corrupt))
		for i, s := range out.Corrupt {
			seqs[i] = strconv.FormatUint(s, 10)
		}
		hint := ""
		if out.Dead {
			hint = "; idem outbox drop SEQ deletes one"
		}
		fmt.Fprintf(a.stderr, "idem: %s not listed: seq %s%s\n",
			plural(len(out.Corrupt), "corrupt message", "corrupt messages"), strings.Join(seqs, ", "), hint)
	}
	what := "pending messages"
	if out.Dead {
		what = "dead letters"
	}
	if out.Matched == 0 {
		if topic != "" {
			what += " of topic " + quoteKey(topic)
		}
		fmt.Fprintf(a.stdout, "no %s\n", what)
		a.printOthers(out)
		return nil
	}
	w := a.table()
	if out.Dead {
		fmt.Fprintln(w, "SEQ\tTOPIC\tDOWNSTREAM KEY\tORDERING KEY\tATTEMPTS\tDEAD AT\tEXPIRES\tPAYLOAD\tLAST ERROR")
	} else {
		fmt.Fprintln(w, "SEQ\tTOPIC\tDOWNSTREAM KEY\tORDERING KEY\tATTEMPT\tNEXT ATTEMPT\tPAYLOAD\tLAST ERROR")
	}
	for _, m := range out.Messages {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t", m.Seq, quoteKey(m.Topic), quoteKey(m.DownstreamKey), quoteKey(m.OrderingKey), m.Attempt)
		if out.Dead {
			fmt.Fprintf(w, "%s\t%s\t", fmtTime(m.DeadAt, "-"), fmtTime(m.ExpiresAt, "-"))
		} else {
			fmt.Fprintf(w, "%s\t", fmtTime(m.NextAttemptAt, "-"))
		}
		fmt.Fprintf(w, "%s\t%s\n", fmtSize(m.PayloadSize), fmtLastErr(m.LastError))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(out.Messages) < out.Matched {
		fmt.Fprintf(a.stdout, "(%d of %d %s; raise --limit for more)\n", len(out.Messages), out.Matched, what)
	}
	a.printOthers(out)
	return nil
}

// printOthers says, under a list of pending messages, that dead letters
// exist and how to list them: an outbox with no pending message but dead
// letters is not empty.
func (a *app) printOthers(out *outboxLsJSON) {
	if !out.Dead && out.Others > 0 {
		fmt.Fprintf(a.stdout, "(and %s; idem outbox ls --dead lists them)\n", plural(out.Others, "dead letter", "dead letters"))
	}
}

// fmtLastErr renders a last error on one line of a table: control
// characters as spaces, cut to maxErrWidth runes.
func fmtLastErr(s *string) string {
	if s == nil {
		return "-"
	}
	t := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, *s)
	if utf8.RuneCountInString(t) > maxErrWidth {
		t = string([]rune(t)[:maxErrWidth-1]) + "…"
	}
	return t
}

// outboxGetJSON is a message with its payload.
type outboxGetJSON = messageJSON

// errStop ends a walk of the messages early.
var errStop = errors.New("stop")

func (a *app) outboxGet(seq uint64, raw bool) (err error) {
	e, err := a.openOutbox()
	if err != nil {
		return err
	}
	defer closeEngine(e, &err)
	m, err := findMessage(e, seq)
	if err != nil {
		var op *idem.OpError
		if errors.As(err, &op) {
			err = op.Err // the command names the operation, once
		}
		return fmt.Errorf("idem: outbox get %d: %w", seq, err)
	}
	if m == nil {
		return fmt.Errorf("idem: outbox get %d: no such message (delivered, dropped, expired or never enqueued)", seq)
	}
	_, hidden := a.hiddenPayload(seq)
	if raw {
		return a.writeRaw(m.Payload, hidden, "payload")
	}
	out := a.messageJSON(m, true)
	if a.json {
		return a.printJSON(out)
	}
	return a.printMessage(&out)
}

// findMessage returns message seq, pending or dead; nil if there is none. A
// message that fails to decode is an error.
func findMessage(e operator, seq uint64) (found *idem.Message, err error) {
	if r, ok := e.(*remote); ok {
		return r.Message(seq)
	}
	err = e.Messages(func(m *idem.Message, merr error) error {
		if m.Seq != seq {
			return nil
		}
		if merr != nil {
			return merr
		}
		found = m
		return errStop
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	return found, err
}

func (a *app) printMessage(out *outboxGetJSON) error {
	w := a.table()
	state := "pending"
	if out.Dead {
		state = "dead"
	}
	fmt.Fprintf(w, "seq\t%d\n", out.Seq)
	fmt.Fprintf(w, "state\t%s\n", state)
	fmt.Fprintf(w, "topic\t%s\n", quoteKey(out.Topic))
	fmt.Fprintf(w, "key\t%s (message %d of the call)\n", quoteKey(out.Key), out.Index)
	fmt.Fprintf(w, "downstream key\t%s\n", quoteKey(out.DownstreamKey))
	fmt.Fprintf(w, "ordering key\t%s\n", quoteKey(out.OrderingKey))
	fmt.Fprintf(w, "attempts\t%d failed\n", out.Attempt)
	fmt.Fprintf(w, "enqueued\t%s\n", fmtTime(&out.EnqueuedAt, "-"))
	if out.Dead {
		fmt.Fprintf(w, "dead at\t%s\n", fmtTime(out.DeadAt, "-"))
		fmt.Fprintf(w, "expires\t%s\n", fmtTime(out.ExpiresAt, "-"))
	} else {
		fmt.Fprintf(w, "next attempt\t%s\n", fmtTime(out.NextAttemptAt, "at once"))
	}
	lastErr := "-"
	if out.LastError != nil {
		lastErr = strconv.Quote(*out.LastError)
	}
	fmt.Fprintf(w, "last error\t%s\n", lastErr)
	switch {
	case out.PayloadHidden:
		fmt.Fprintf(w, "payload\t%s, %s\n", fmtSize(out.PayloadSize), hiddenNote)
	case out.Payload == nil:
		fmt.Fprintf(w, "payload\tnone\n")
	case out.PayloadEncoding == "base64":
		fmt.Fprintf(w, "payload\t%s, not UTF-8; base64 below (or outbox get --raw)\n", fmtSize(out.PayloadSize))
	default:
		fmt.Fprintf(w, "payload\t%s\n", fmtSize(out.PayloadSize))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if out.Payload != nil && *out.Payload != "" {
		fmt.Fprintln(a.stdout, *out.Payload)
	}
	return nil
}

// deadOp is retry or drop of one dead letter.
type deadOp struct {
	name string                       // as in the command line
	past string                       // as in the output
	do   func(operator, uint64) error // the engine's call
	done string                       // what became of the message, for humans
}

var (
	retryOp = deadOp{"retry", "retried", operator.RetryDead,
		"pending again, attempts reset; the program's dispatcher delivers it"}
	dropOp = deadOp{"drop", "dropped", operator.DropDead,
		"deleted, never to be delivered"}
)

type outboxOpJSON struct {
	Op     string         `json:"op"`     // "retry" or "drop"
	Done   []uint64       `json:"done"`   // the dead letters retried or dropped
	Failed []seqErrorJSON `json:"failed"` // the others, with why
}

type seqErrorJSON struct {
	Seq   uint64 `json:"seq"`
	Error string `json:"error"`
}

// outboxOperate retries or drops every dead letter named in args, each in
// its own transaction: one that fails is reported, the others go on.
func (a *app) outboxOperate(args []string, op deadOp) (err error) {
	seqs, err := parseSeqs(args)
	if err != nil {
		return err
	}
	e, err := a.openOutbox()
	if err != nil {
		return err
	}
	defer closeEngine(e, &err)

	out := outboxOpJSON{Op: op.name, Done: []uint64{}, Failed: []seqErrorJSON{}}
	for _, seq := range seqs {
		switch err := op.do(e, seq); {
		case err == nil:
			out.Done = append(out.Done, seq)
		case errors.Is(err, idem.ErrMessageNotFound):
			out.Failed = append(out.Failed, seqErrorJSON{seq, notDeadReason(e, seq)})
		case errors.Is(err, idem.ErrCorrupt):
			out.Failed = append(out.Failed, seqErrorJSON{seq, fmt.Sprintf("dead letter %d fails to decode; it can only be dropped", seq)})
		default:
			return err
		}
	}
	if a.json {
		if err := a.printJSON(out); err != nil {
			return err
		}
	} else {
		for _, seq := range out.Done {
			fmt.Fprintf(a.stdout, "%s %d: %s\n", op.past, seq, op.done)
		}
	}
	for _, f := range out.Failed {
		fmt.Fprintf(a.stderr, "idem: outbox %s %d: %s\n", op.name, f.Seq, f.Error)
	}
	if len(out.Failed) > 0 {
		return &exitError{code: 1}
	}
	return nil
}

// notDeadReason says why seq is not a dead letter.
func notDeadReason(e operator, seq uint64) string {
	if m, err := findMessage(e, seq); err == nil && m != nil && !m.Dead {
		return fmt.Sprintf("message %d is pending, not a dead letter", seq)
	}
	return fmt.Sprintf("no dead letter %d (delivered, dropped, expired or never enqueued)", seq)
}

// parseSeqs parses sequence numbers, without duplicates, in the order given.
func parseSeqs(args []string) ([]uint64, error) {
	seqs := make([]uint64, 0, len(args))
	for _, arg := range args {
		seq, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || seq == 0 {
			return nil, &usageError{fmt.Errorf("%q is not a message sequence number (a positive integer, as outbox ls shows)", arg)}
		}
		if !slices.Contains(seqs, seq) {
			seqs = append(seqs, seq)
		}
	}
	return seqs, nil
}
