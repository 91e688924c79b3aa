package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"

	"github.com/spf13/cobra"
)

func newResolveCmd(a *app) *cobra.Command {
	var o resolveOpts
	c := &cobra.Command{
		Use:   "resolve KEY (--response STRING | --response-file PATH | --error MESSAGE [--code CODE])",
		Short: "Complete an interrupted execution by hand",
		Long: `resolve completes KEY's interrupted execution (a started record: the function
may or may not have had its effect) as if the function had returned: the
record becomes done, and every later call with KEY replays what you give here.

Find out first what happened downstream. Then give the response the function
would have returned (--response, or --response-file, "-" for stdin; an empty
--response "" stores an empty response, which differs from none), and/or the
permanent error it would have returned (--error MESSAGE, --code CODE), which
later calls replay as *idem.Error. To run the function again instead, use
idem forget KEY.

For a key of idemhttp's Middleware, --http-status N (with --http-header
"Name: value", repeatable) stores an HTTP answer in the middleware's format
(idemhttp.EncodeResponse), the body being --response or --response-file
(none: empty); every retry with the key then gets that answer. Without it,
the middleware replays a --response as 200 application/octet-stream and an
--error as 500 ProblemStoredError.`,
		Args: cobra.ExactArgs(1),
	}
	keyArg(c, func(cmd *cobra.Command, key string) error {
		o.responseSet = cmd.Flags().Changed("response")
		o.fileSet = cmd.Flags().Changed("response-file")
		o.httpSet = cmd.Flags().Changed("http-status")
		return a.resolve(key, o)
	})
	f := c.Flags()
	f.StringVar(&o.response, "response", "", "the response to store, as a string")
	f.StringVar(&o.file, "response-file", "", `read the response to store from this file ("-": stdin)`)
	f.StringVar(&o.code, "code", "", "code of the stored error (idem.Error.Code)")
	f.StringVar(&o.errMsg, "error", "", "message of the stored error: resolve as a permanent error")
	f.IntVar(&o.httpStatus, "http-status", 0, "store an HTTP answer with this status for idemhttp's middleware (body: --response)")
	f.StringArrayVar(&o.httpHeaders, "http-header", nil, `a header of the HTTP answer, "Name: value" (repeatable; with --http-status)`)
	return c
}

type resolveOpts struct {
	response, file, code, errMsg string
	responseSet, fileSet         bool
	httpStatus                   int
	httpHeaders                  []string
	httpSet                      bool
}

type resolveJSON struct {
	Key          string     `json:"key"`
	State        string     `json:"state"`
	ResponseSize *int       `json:"response_size"` // null: no response
	Error        *errorJSON `json:"error"`
}

func (a *app) resolve(key string, o resolveOpts) (err error) {
	if o.responseSet && o.fileSet {
		return &usageError{errors.New("resolve: give --response or --response-file, not both")}
	}
	if len(o.httpHeaders) > 0 && !o.httpSet {
		return &usageError{errors.New("resolve: --http-header needs --http-status")}
	}
	if o.httpSet && (o.errMsg != "" || o.code != "") {
		return &usageError{errors.New("resolve: --http-status stores an HTTP answer, not an error: drop --error and --code")}
	}
	if !o.responseSet && !o.fileSet && !o.httpSet && o.errMsg == "" && o.code == "" {
		return &usageError{errors.New("resolve: say what the execution returned: --response, --response-file, or --error (with --code)")}
	}
	var resp []byte
	switch {
	case o.responseSet:
		resp = []byte(o.response)
	case o.fileSet:
		if resp, err = a.readResponse(o.file); err != nil {
			return err
		}
	}
	if o.httpSet {
		header := http.Header{}
		for _, h := range o.httpHeaders {
			name, value, ok := strings.Cut(h, ":")
			if !ok {
				return &usageError{fmt.Errorf("resolve: --http-header %q is not \"Name: value\"", h)}
			}
			header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		}
		if resp, err = idemhttp.EncodeResponse(o.httpStatus, header, resp); err != nil {
			return &usageError{fmt.Errorf("resolve: %w", err)}
		}
	}

	e, err := a.openOperator()
	if err != nil {
		return err
	}
	defer closeEngine(e, &err)
	var outcome *idem.Error
	if o.code != "" || o.errMsg != "" {
		outcome = &idem.Error{Code: o.code, Message: o.errMsg}
	}
	if err := e.Resolve(key, resp, outcome); err != nil {
		return err
	}
	out := resolveJSON{Key: key, State: "done"}
	if resp != nil {
		n := len(resp)
		out.ResponseSize = &n
	}
	if o.errMsg != "" || o.code != "" {
		out.Error = &errorJSON{Code: o.code, Message: o.errMsg}
	}
	if a.json {
		return a.printJSON(out)
	}
	what := "no response"
	if resp != nil {
		what = "a response of " + fmtBytes(int64(len(resp)))
	}
	if out.Error != nil {
		what += " and a stored error (code " + fmtErr(out.Error) + ")"
	}
	_, err = fmt.Fprintf(a.stdout, "resolved %s: done, with %s; later calls replay it\n", quoteKey(key), what)
	return err
}

func (a *app) readResponse(path string) ([]byte, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(a.stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("idem: --response-file: %w", err)
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}
