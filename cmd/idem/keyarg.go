package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
)

// keyArg gives c (get, forget, resolve) the --quoted flag and returns the
// function that reads KEY from the arguments: as given, or, with --quoted,
// Go-quoted as ls prints a key with spaces, control or invisible characters.
// A key with a NUL (which an earlier version could store) cannot be passed
// as an argument at all, since the operating system ends arguments at NUL:
// --quoted '"\x00"' reaches it.
func keyArg(c *cobra.Command) func(args []string) (string, error) {
	var quoted bool
	c.Flags().BoolVar(&quoted, "quoted", false, `KEY is Go-quoted, as ls prints keys with spaces or invisible characters ("\x00", "k\ufeff")`)
	return func(args []string) (string, error) {
		if !quoted {
			return args[0], nil
		}
		k, err := strconv.Unquote(args[0])
		if err != nil {
			return "", &usageError{fmt.Errorf("--quoted: %s is not a Go-quoted string (as ls prints keys)", strconv.Quote(args[0]))}
		}
		return k, nil
	}
}
