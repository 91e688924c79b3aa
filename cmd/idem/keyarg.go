package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
)

// keyArg gives c (get, forget, resolve) the --quoted flag and makes its
// RunE call run with KEY, read from the arguments: as given, or, with
// --quoted, Go-quoted as ls prints a key with spaces, control or invisible
// characters. A key with a NUL (which an earlier version could store) cannot
// be passed as an argument at all, since the operating system ends
// arguments at NUL: --quoted '"\x00"' reaches it.
func keyArg(c *cobra.Command, run func(cmd *cobra.Command, key string) error) {
	var quoted bool
	c.Flags().BoolVar(&quoted, "quoted", false, `KEY is Go-quoted, as ls prints keys with spaces or invisible characters ("\x00", "k\ufeff")`)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if !quoted {
			return run(cmd, args[0])
		}
		k, err := strconv.Unquote(args[0])
		if err != nil {
			return &usageError{fmt.Errorf("--quoted: %s is not a Go-quoted string (as ls prints keys)", strconv.Quote(args[0]))}
		}
		return run(cmd, k)
	}
}
