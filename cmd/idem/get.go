package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
)

func newGetCmd(a *app) *cobra.Command {
	var raw bool
	c := &cobra.Command{
		Use:   "get KEY",
		Short: "Show one record, with its response",
		Long: `get shows KEY's live record: state, attempt, fingerprint, times, stored
error, and the response. --raw writes only the response bytes, as stored.
With --json the response is a string: UTF-8 text as is, other bytes in base64
(response_encoding says which); null when there is no response, which differs
from an empty one.`,
		Args: cobra.ExactArgs(1),
	}
	keyArg(c, func(_ *cobra.Command, key string) error { return a.get(key, raw) })
	c.Flags().BoolVar(&raw, "raw", false, "write only the response bytes to stdout")
	return c
}

// getJSON is a record with its response.
type getJSON = recordJSON

func (a *app) get(key string, raw bool) (err error) {
	e, err := a.openOperator()
	if err != nil {
		return err
	}
	defer closeEngine(e, &err)
	r, err := e.Get(key)
	if err != nil {
		return err
	}
	n, hidden := a.hiddenResponse(key)
	if raw {
		return a.writeRaw(r.Response, hidden, "response")
	}
	out := a.recordJSON(r, true)
	if hidden {
		out.ResponseSize, out.Response, out.ResponseEncoding, out.ResponseHidden = &n, nil, "", true
	}
	if at, ok := a.serverExpiry(key); ok {
		out.ExpiresAt = at
	}
	if a.json {
		return a.printJSON(out)
	}
	return a.printRecord(r, out)
}

func (a *app) printRecord(r *idem.Record, out getJSON) error {
	w := a.table()
	fmt.Fprintf(w, "key\t%s\n", quoteKey(out.Key))
	fmt.Fprintf(w, "state\t%s\n", out.State)
	fmt.Fprintf(w, "attempt\t%d\n", out.Attempt)
	fmt.Fprintf(w, "fingerprint\t%s\n", out.Fingerprint)
	fmt.Fprintf(w, "started\t%s\n", fmtTime(&out.StartedAt, "-"))
	fmt.Fprintf(w, "completed\t%s\n", fmtTime(out.CompletedAt, "-"))
	fmt.Fprintf(w, "expires\t%s\n", fmtTime(out.ExpiresAt, "never"))
	retention := out.Retention
	if out.KeptUntilResolved {
		retention += ", kept until resolved"
	}
	fmt.Fprintf(w, "retention\t%s\n", retention)
	if out.Error != nil {
		fmt.Fprintf(w, "error\t%s\n", r.Err.Error())
	} else {
		fmt.Fprintf(w, "error\t-\n")
	}
	switch {
	case out.ResponseHidden:
		fmt.Fprintf(w, "response\t%s, %s\n", fmtSize(out.ResponseSize), hiddenNote)
	case r.Response == nil:
		fmt.Fprintf(w, "response\tnone\n")
	case out.ResponseEncoding == "base64":
		fmt.Fprintf(w, "response\t%s, not UTF-8; base64 below (or get --raw)\n", fmtBytes(int64(len(r.Response))))
	default:
		fmt.Fprintf(w, "response\t%s\n", fmtBytes(int64(len(r.Response))))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if out.Response != nil && *out.Response != "" {
		fmt.Fprintln(a.stdout, *out.Response)
	}
	return nil
}
