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
// does: each destination of the types below from a binary column of the
// matching type directly, or the whole row by rows.Scan if any one is not.
//
//	*int64   bigint        **int64   bigint or NULL
//	*int32   integer       *string   text
//	*int     integer       **string  text or NULL
//	*int16   smallint      *[]byte   bytea or NULL (nil), copied
//	*bool    boolean       nil       any column, skipped
func scanRow(rows pgx.Rows, dst ...any) error {
	fds, vals := rows.FieldDescriptions(), rows.RawValues()
	if len(fds) != len(dst) || len(vals) != len(dst) || !decodable(fds, vals, dst) {
		return rows.Scan(dst...)
	}
	for i, d := range dst {
		v := vals[i]
		switch d := d.(type) {
		case *int64:
			*d = int64(binary.BigEndian.Uint64(v))
		case **int64:
			if v == nil {
				*d = nil
			} else {
				n := int64(binary.BigEndian.Uint64(v))
				*d = &n
			}
		case *int32:
			*d = int32(binary.BigEndian.Uint32(v))
		case *int:
			*d = int(int32(binary.BigEndian.Uint32(v)))
		case *int16:
			*d = int16(binary.BigEndian.Uint16(v))
		case *bool:
			*d = v[0] != 0
		case *string:
			*d = string(v)
		case **string:
			if v == nil {
				*d = nil
			} else {
				s := string(v)
				*d = &s
			}
		case *[]byte:
			if v == nil {
				*d = nil
			} else {
				*d = append(make([]byte, 0, len(v)), v...)
			}
		}
	}
	return nil
}

// decodable reports whether scanRow decodes every column itself: each in
// the binary format (text in either), of the type its destination reads, of that type's
// length, and NULL only where the destination can say so.
func decodable(fds []pgconn.FieldDescription, vals [][]byte, dst []any) bool {
	for i, d := range dst {
		fd, v := fds[i], vals[i]
		var oid uint32
		size := -1 // any length
		null := false
		switch d.(type) {
		case nil:
			continue // skipped, as by Scan
		case *int64:
			oid, size = pgtype.Int8OID, 8
		case **int64:
			oid, size, null = pgtype.Int8OID, 8, true
		case *int32, *int:
			oid, size = pgtype.Int4OID, 4
		case *int16:
			oid, size = pgtype.Int2OID, 2
		case *bool:
			oid, size = pgtype.BoolOID, 1
		case *string:
			oid = pgtype.TextOID
		case **string:
			oid, null = pgtype.TextOID, true
		case *[]byte:
			oid, null = pgtype.ByteaOID, true
		default:
			return false
		}
		// text's binary format is its text; pgx asks for text as text.
		if fd.DataTypeOID != oid || fd.Format != pgx.BinaryFormatCode && oid != pgtype.TextOID {
			return false
		}
		if v == nil {
			if !null {
				return false
			}
			continue
		}
		if size >= 0 && len(v) != size {
			return false
		}
	}
	return true
}
