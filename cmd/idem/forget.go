package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newForgetCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "forget KEY",
		Short: "Delete KEY's record in any state: the next call with KEY runs as new",
		Long: `forget deletes every stored version of KEY's record, started or done, expired
or not. The next call with KEY runs its function again, as for a new key.`,
		Args: cobra.ExactArgs(1),
	}
	keyArg(c, func(_ *cobra.Command, key string) error { return a.forget(key) })
	return c
}

type forgetJSON struct {
	Key       string `json:"key"`
	Forgotten bool   `json:"forgotten"`
}

func (a *app) forget(key string) (err error) {
	e, err := a.openOperator()
	if err != nil {
		return err
	}
	defer closeEngine(e, &err)
	if err := e.Forget(key); err != nil {
		return err
	}
	if a.json {
		return a.printJSON(forgetJSON{Key: key, Forgotten: true})
	}
	_, err = fmt.Fprintf(a.stdout, "forgot %s: the next call with this key runs as new\n", quoteKey(key))
	return err
}
