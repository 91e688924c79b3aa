package idempg

import (
	"context"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// decodeDests are fresh destinations of every type scanRow decodes itself,
// in the order of decodeSQL's columns.
func decodeDests() []any {
	var (
		a, b       int64
		c, d       *int64
		e          int32
		f          int
		g          int16
		h, i       bool
		j          string
		k, l       *string
		m, n, o, p []byte
	)
	return []any{&a, &b, &c, &d, &e, &f, &g, &h, &i, &j, &k, &l, &m, &n, &o, &p}
}

// decodeSQL answers rows of decodeDests' types, NULLs and edge values
// among them.
const decodeSQL = `SELECT * FROM (VALUES
	('-9223372036854775808'::bigint, 9223372036854775807::bigint, NULL::bigint, -1::bigint, '-2147483648'::integer,
		2147483647::integer, '-32768'::smallint, true, false, ''::text, NULL::text, 'é\u00a0k'::text,
		NULL::bytea, ''::bytea, '\x00ff'::bytea, convert_to(repeat('r', 70000), 'UTF8')),
	(0, 1, 2, NULL, 0, -1, 32767::smallint, false, true, 'key', 'owner', NULL, '\x01'::bytea, NULL, ''::bytea, ''::bytea)
) AS v`

// TestScanRowDecodesAsScan checks scanRow against pgx's Scan on the same
// rows: on a prepared statement (binary columns, decoded by scanRow) and in
// QueryExecModeExec (text columns: Scan's own decoding), nil and empty
// bytea told apart.
func TestScanRowDecodesAsScan(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Env)
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			var want [][]any
			rows, err := pool.Query(ctx, decodeSQL, mode)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				d := decodeDests()
				if err := rows.Scan(d...); err != nil {
					t.Fatal(err)
				}
				want = append(want, d)
			}
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
			rows, err = pool.Query(ctx, decodeSQL, mode)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for n := 0; rows.Next(); n++ {
				d := decodeDests()
				if got, want := decodeRow(rows.FieldDescriptions(), rows.RawValues(), decodeDests()), mode == pgx.QueryExecModeCacheStatement; got != want {
					t.Fatalf("row %d: decodeRow = %v, want %v", n, got, want)
				}
				if err := scanRow(rows, d...); err != nil {
					t.Fatal(err)
				}
				for i := range d {
					if !reflect.DeepEqual(d[i], want[n][i]) {
						t.Errorf("row %d column %d: scanRow read %#v, Scan %#v", n, i+1, reflect.ValueOf(d[i]).Elem(), reflect.ValueOf(want[n][i]).Elem())
					}
				}
			}
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
		})
	}
}

// TestScanRowRefusesAsScan: a NULL where the destination cannot hold one,
// and a column of another type than the destination's, are pgx's Scan's to
// decode or refuse; queryRow answers pgx.ErrNoRows for no row.
func TestScanRowRefusesAsScan(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Env)
	ctx := context.Background()
	var n int64
	var s string
	if err := queryRow(ctx, pool, `SELECT NULL::bigint`, nil, &n); err == nil {
		t.Fatal("a NULL bigint scanned into an int64 without an error")
	}
	if err := queryRow(ctx, pool, `SELECT 'x'::text`, nil, &n); err == nil {
		t.Fatalf("a text scanned into an int64 without an error: %d", n)
	}
	if err := queryRow(ctx, pool, `SELECT 7::bigint`, nil, &s); err != nil || s != "7" {
		t.Fatalf("a bigint into a string: %q, %v (pgx's Scan reads it)", s, err)
	}
	if err := queryRow(ctx, pool, `SELECT 7::integer`, nil, &n); err != nil || n != 7 {
		t.Fatalf("an integer into an int64: %d, %v (pgx's Scan reads it)", n, err)
	}
	if err := queryRow(ctx, pool, `SELECT 8::bigint, pg_notify('idem_decode_test', '')`, nil, &n, nil); err != nil || n != 8 {
		t.Fatalf("a column skipped by a nil destination: %d, %v", n, err)
	}
	if err := queryRow(ctx, pool, `SELECT 1 WHERE false`, nil, &n); err != pgx.ErrNoRows {
		t.Fatalf("no row: %v, want pgx.ErrNoRows", err)
	}
	if err := queryRow(ctx, pool, `SELECT 1/0`, nil, &n); err == nil {
		t.Fatal("a failing statement answered no error")
	}
}
