package idempg

import (
	"context"
	"encoding/binary"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The hot statements (Lookup, the claims, the completions) read their rows
// with scanRow instead of pgx's Scan. pgx plans a scan for each column of
// each row it scans (a lookup by the column's type and the destination's,
// then the plan's own checks): for Lookup's twelve columns that was 5–9 µs
// of the client's CPU per replay on the bench machine, up to a sixth of it
// (bench/RESULTS.md, "Issue 21: the replay's decode"). The columns these
// statements answer are few and of fixed types, and pgx asks the server for
// them in the binary format whenever it has prepared the statement (its
// statement cache, the default), so scanRow decodes them itself: a type
// switch per column, no plan. Any other row (a text-format row, as in
// PollOnly mode; a column of another type; a NULL where the destination
// cannot hold one) goes to pgx's Scan whole, which decodes it or returns
// its error as before.

// querier is what the hot statements run on: a pool, a connection or a
// transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// queryRow is q.QueryRow(ctx, sql, args...).Scan(dst...), decoded by
// scanRow: the first row's columns into dst, pgx.ErrNoRows for none.
func queryRow(ctx context.Context, q querier, sql string, args []any, dst ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := scanRow(rows, dst...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// scanRow reads the current row of rows into dst, as rows.Scan(dst...)
// does: by decodeRow, or the whole row by rows.Scan if decodeRow cannot.
func scanRow(rows pgx.Rows, dst ...any) error {
	if decodeRow(rows.FieldDescriptions(), rows.RawValues(), dst) {
		return nil
	}
	return rows.Scan(dst...)
}

// decodeRow decodes each of vals into its destination in dst and reports
// whether it could: each column in the binary format (text in either), of
// the type its destination reads, of that type's length, and NULL only
// where the destination can say so. Reporting false, it may have written
// some of dst (rows.Scan then writes them all).
//
//	*int64   bigint        **int64   bigint or NULL
//	*int32   integer       *string   text
//	*int     integer       **string  text or NULL
//	*int16   smallint      *[]byte   bytea or NULL (nil), copied
//	*bool    boolean       nil       any column, skipped
func decodeRow(fds []pgconn.FieldDescription, vals [][]byte, dst []any) bool {
	if len(fds) != len(dst) || len(vals) != len(dst) {
		return false
	}
	for i, d := range dst {
		if d == nil {
			continue // skipped, as by Scan
		}
		fd, v := fds[i], vals[i]
		if fd.Format != pgx.BinaryFormatCode && fd.DataTypeOID != pgtype.TextOID {
			return false // text's binary format is its text; pgx asks for text as text
		}
		ok := false
		switch d := d.(type) {
		case *int64:
			if ok = fd.DataTypeOID == pgtype.Int8OID && len(v) == 8; ok {
				*d = int64(binary.BigEndian.Uint64(v))
			}
		case **int64:
			if ok = fd.DataTypeOID == pgtype.Int8OID && (v == nil || len(v) == 8); ok {
				*d = nil
				if v != nil {
					n := int64(binary.BigEndian.Uint64(v))
					*d = &n
				}
			}
		case *int32:
			if ok = fd.DataTypeOID == pgtype.Int4OID && len(v) == 4; ok {
				*d = int32(binary.BigEndian.Uint32(v))
			}
		case *int:
			if ok = fd.DataTypeOID == pgtype.Int4OID && len(v) == 4; ok {
				*d = int(int32(binary.BigEndian.Uint32(v)))
			}
		case *int16:
			if ok = fd.DataTypeOID == pgtype.Int2OID && len(v) == 2; ok {
				*d = int16(binary.BigEndian.Uint16(v))
			}
		case *bool:
			if ok = fd.DataTypeOID == pgtype.BoolOID && len(v) == 1; ok {
				*d = v[0] != 0
			}
		case *string:
			if ok = fd.DataTypeOID == pgtype.TextOID && v != nil; ok {
				*d = string(v)
			}
		case **string:
			if ok = fd.DataTypeOID == pgtype.TextOID; ok {
				*d = nil
				if v != nil {
					s := string(v)
					*d = &s
				}
			}
		case *[]byte:
			if ok = fd.DataTypeOID == pgtype.ByteaOID; ok {
				*d = nil
				if v != nil {
					*d = append(make([]byte, 0, len(v)), v...)
				}
			}
		}
		if !ok {
			return false
		}
	}
	return true
}
