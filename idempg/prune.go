package idempg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
)

// Prune implements idemcore.Backend: DELETEs of at most req.Limit expired rows
// each, by the expiry index, until none is left.
func (b *backend) Prune(ctx context.Context, req idemcore.PruneRequest) (idemcore.PruneResult, error) {
	limit := req.Limit
	if limit <= 0 {
		limit = b.s.PruneBatch
	}
	var res idemcore.PruneResult
	now := toNs(req.Now)
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := fault.Err("prune-before-drop"); err != nil {
			return res, err // as a failed DELETE
		}
		rows, err := b.pool.Query(ctx, b.sql(`DELETE FROM {schema}.idem_records WHERE key IN (
				SELECT key FROM {schema}.idem_records AS r
				WHERE expires_ns > 0 AND expires_ns <= $1::bigint AND (NOT $3::boolean OR state = 2)
					AND `+fmt.Sprintf(expiredSQL, "r", "$2::bigint", "$1::bigint", "$5::text")+`
				ORDER BY expires_ns LIMIT $4::integer FOR UPDATE SKIP LOCKED)
			RETURNING state`), b.s.args(now, int64(req.Retention), req.KeepStarted, limit, b.owner)...)
		if err != nil {
			return res, err
		}
		states, err := pgx.CollectRows(rows, pgx.RowTo[int16])
		if err == nil {
			err = fault.Err("prune-after-drop") // as a DELETE whose answer was lost
		}
		if err != nil {
			return res, err
		}
		for _, s := range states {
			res.Deleted++
			if idemcore.State(s) == idemcore.StateStarted {
				res.Interrupted++
			}
		}
		if len(states) < limit {
			return res, nil
		}
	}
}
