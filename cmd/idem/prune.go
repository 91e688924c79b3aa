package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func newPruneCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "prune",
		Short: "Reclaim the space of expired records now",
		Long: `prune reclaims the space of expired records, as the program's background
pruner would. Each record carries the retention window it was written under,
and an interrupted execution written under the refuse policy is kept until
resolved: prune judges by that, so it never removes a record the program still
treats as live (--retention and --recovery refuse only keep more). Records sit
in time slots as wide as their window, and a slot is dropped whole once every
record in it has expired (a slot that holds a kept record stays for it): a
record may wait up to one window past its expiry, which is why stats can show
records awaiting prune that prune does not remove yet. Every reader already
treats them as absent. The file does not shrink: freed pages are reused; run
idem compact to shrink it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.prune(cmd.Context()) },
	}
}

type pruneJSON struct {
	Pruned      int  `json:"pruned"`
	Interrupted bool `json:"interrupted"`
}

func (a *app) prune(ctx context.Context) (err error) {
	e, err := a.openEngine()
	if err != nil {
		return err
	}
	defer closeEngine(e, &err)
	n, err := e.Prune(ctx)
	interrupted := errors.Is(err, context.Canceled)
	if err != nil && !interrupted {
		return err
	}
	if a.json {
		if err := a.printJSON(pruneJSON{Pruned: n, Interrupted: interrupted}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "pruned %s (the file keeps its size; idem compact shrinks it)\n", plural(n, "expired record", "expired records"))
	}
	if interrupted {
		return &exitError{code: 1, msg: "idem: prune interrupted; what was pruned stays pruned"}
	}
	return nil
}
