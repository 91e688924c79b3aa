package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/idemkit/idem/kit/taubench"
)

func newTaubenchServeCmd(a *app) *cobra.Command {
	var (
		data    string
		useIdem bool
	)
	c := &cobra.Command{
		Use:   "serve",
		Short: "Serve the 16 τ-bench retail tools as an MCP server over stdio",
		Long: `serve runs the τ-bench retail tools (the same Go tools taubench plays) as an
MCP server on stdin and stdout, over the file --db. A file that does not exist
yet is created and seeded from the τ-bench data, looked for as by idem
taubench (--data, $IDEM_TAUBENCH_DATA, then ../shared/taubench/retail beside
the checkout), or, if there is none there, from the built-in sample (a line on
stderr says so).

With --idem (the default) the tools are served through idemmcp: write tools
in the DoTx form, keyed by the _meta entry "io.github.idemkit/idempotency-key",
refused without it; read tools (annotated read-only) pass through. With
--idem=false they are served with no dedupe, one transaction per call: a tool
server without idem, for idem mcp-proxy to stand in front of.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := os.Stat(a.db); errors.Is(err, fs.ErrNotExist) {
				dir, sample, cleanup, err := a.retailData(data)
				defer cleanup()
				if err != nil {
					return err
				}
				if sample {
					fmt.Fprintln(a.stderr, "τ-bench serve: no τ-bench data found: seeding "+a.db+" with idem's built-in sample "+
						"(a generated retail world, not τ-bench's); point at τ-bench's with --data DIR or $"+envTaubenchData)
				}
				if err := taubench.SeedFile(a.db, dir); err != nil {
					return err
				}
			}
			t := &mcp.IOTransport{Reader: io.NopCloser(a.stdin), Writer: nopWriteCloser{a.stdout}}
			return taubench.ServeMCP(cmd.Context(), taubench.ServeConfig{DB: a.db, Idem: useIdem}, t)
		},
	}
	f := c.Flags()
	f.StringVar(&data, "data", "", "directory of τ-bench's retail data, to seed a new --db file")
	f.BoolVar(&useIdem, "idem", true, "serve the tools through idemmcp (false: no dedupe)")
	return c
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
