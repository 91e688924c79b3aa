package main

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/idemkit/idem/idempg"
)

func newMigrateCmd(a *app) *cobra.Command {
	var (
		dsn      string
		schema   string
		pollOnly bool
	)
	c := &cobra.Command{
		Use:   "migrate --pg DSN",
		Short: "Create or upgrade the Postgres backend's schema (idempg)",
		Long: `migrate creates the Postgres backend's tables (github.com/idemkit/idem/idempg)
in the database DSN names, or upgrades them to the version this build knows,
as idempg.Migrate does. It is idempotent, and safe to run from several places
at once (no advisory locks). --db does not apply: the records live in
Postgres. DSN is a pgx connection string (postgres://user@host:5432/db, or
key=value pairs); $IDEM_PG, if set, is the default. Through PgBouncer in
transaction pooling mode, add --poll-only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("pg") {
				dsn = a.getenv("IDEM_PG")
			}
			if dsn == "" {
				return &usageError{fmt.Errorf("migrate needs --pg DSN (or $IDEM_PG)")}
			}
			if schema == "" {
				// Given explicitly (the flag's default is DefaultSchema): an
				// empty variable in a script must not migrate public.
				return &usageError{fmt.Errorf("--schema is empty (leave it out for %s)", idempg.DefaultSchema)}
			}
			return a.migrate(cmd.Context(), dsn, &idempg.Options{Schema: schema, PollOnly: pollOnly})
		},
	}
	c.Flags().StringVar(&dsn, "pg", "", "the Postgres database (a pgx DSN); $IDEM_PG, if set, is the default")
	c.Flags().StringVar(&schema, "schema", idempg.DefaultSchema, "the schema that holds idem's tables (idempg.Options.Schema)")
	c.Flags().BoolVar(&pollOnly, "poll-only", false, "no prepared statements, for PgBouncer in transaction pooling mode (idempg.Options.PollOnly)")
	return c
}

type migrateJSON struct {
	Schema  string `json:"schema"`
	Applied []int  `json:"applied"`
	Version int    `json:"version"`
}

func (a *app) migrate(ctx context.Context, dsn string, opts *idempg.Options) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors quote the DSN, password included: say less.
		return fmt.Errorf("migrate: --pg is not a valid connection string")
	}
	cfg.MaxConns = 2
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if opts.PollOnly {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()
	applied, err := idempg.Migrate(ctx, pool, opts)
	if err != nil {
		return pgError{err}
	}
	if applied == nil {
		applied = []int{}
	}
	schema := cmp.Or(opts.Schema, idempg.DefaultSchema)
	if a.json {
		return a.printJSON(migrateJSON{Schema: schema, Applied: applied, Version: idempg.SchemaVersion})
	}
	if len(applied) == 0 {
		fmt.Fprintf(a.stdout, "schema %s is up to date (version %d)\n", schema, idempg.SchemaVersion)
		return nil
	}
	vs := make([]string, len(applied))
	for i, v := range applied {
		vs[i] = strconv.Itoa(v)
	}
	word := "version"
	if len(applied) > 1 {
		word = "versions"
	}
	fmt.Fprintf(a.stdout, "applied %s %s; schema %s is at version %d\n", word, strings.Join(vs, ", "), schema, idempg.SchemaVersion)
	return nil
}

// pgError is an idempg error on the CLI's error line: "idem: migrate: …",
// without idempg's own prefix after the CLI's.
type pgError struct{ err error }

func (e pgError) Error() string { return strings.TrimPrefix(e.err.Error(), "idempg: ") }
func (e pgError) Unwrap() error { return e.err }
