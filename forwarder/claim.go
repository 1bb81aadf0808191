package forwarder

import "github.com/outboxkit/outboxkit/store"

// groupByKey groups claimed rows by partition key: each group is one key's rows in seq order, a
// row without a key is a group of its own, and groups are ordered by their first row.
func groupByKey(rows []store.OutboxRow) [][]store.OutboxRow {
	byKey := map[string]int{}
	var groups [][]store.OutboxRow
	for _, r := range rows {
		if r.PartitionKey == "" {
			groups = append(groups, []store.OutboxRow{r})
			continue
		}
		if i, ok := byKey[r.PartitionKey]; ok {
			groups[i] = append(groups[i], r)
			continue
		}
		byKey[r.PartitionKey] = len(groups)
		groups = append(groups, []store.OutboxRow{r})
	}
	return groups
}
