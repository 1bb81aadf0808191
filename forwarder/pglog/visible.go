package pglog

import (
	"context"
	"fmt"
	"time"
)

// waitVisible returns once no transaction of xids is still running in a new snapshot: their
// commits, which the log has sent, are then visible to the relay's statements. It asks again every
// few milliseconds; a commit is visible a moment after the log sends it, so a wait of seconds is an
// error (the session restarts and reads again from the confirmed position).
func (d *dispatcher) waitVisible(ctx context.Context, xids []uint32) error {
	if len(xids) == 0 {
		return nil
	}
	ids := make([]int64, len(xids))
	for i, x := range xids {
		ids[i] = int64(x)
	}
	const limit = 10 * time.Second
	deadline := time.Now().Add(limit)
	for {
		var running int
		// pgoutput's 32-bit transaction ids are taken to the snapshot's 64-bit ones in the statement.
		err := d.s.r.cfg.Pool.QueryRow(ctx, d.s.r.sql.RunningXids, ids).Scan(&running)
		if err != nil {
			return fmt.Errorf("check that the published rows' transactions are visible: %w", err)
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d transactions the log sent as committed are still running after %s: cannot remove their rows", running, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
