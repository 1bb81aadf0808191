package main

import "testing"

func TestJudgeReadCommitted(t *testing.T) {
	events := map[string]outboxEvent{
		"a1": {key: "a", seq: 1}, "a2": {key: "a", seq: 3},
		"b1": {key: "b", seq: 2}, "b2": {key: "b", seq: 4},
	}
	rec := func(partition int32, offset int64, key, uuid string) rawRecord {
		return rawRecord{partition: partition, offset: offset, key: key, uuid: uuid}
	}
	exactlyOnce := []rawRecord{rec(0, 0, "a", "a1"), rec(0, 1, "a", "a2"), rec(1, 0, "b", "b1"), rec(1, 1, "b", "b2")}
	tests := []struct {
		name                                     string
		recs                                     []rawRecord
		txn                                      bool
		duplicates, missing, inversions, foreign int
		violations                               int
	}{
		{name: "each event once, in its key's order", recs: exactlyOnce, txn: true},
		{name: "a duplicate with transactions is a violation", txn: true, duplicates: 1, violations: 1,
			recs: append(exactlyOnce[:2:2], rec(0, 2, "a", "a1"), rec(1, 0, "b", "b1"), rec(1, 1, "b", "b2"))},
		{name: "a duplicate without transactions is information", duplicates: 1,
			recs: append(exactlyOnce[:2:2], rec(0, 2, "a", "a1"), rec(1, 0, "b", "b1"), rec(1, 1, "b", "b2"))},
		{name: "a gap", txn: true, missing: 1, violations: 1, recs: exactlyOnce[:3]},
		{name: "an inversion: a key's later event first", txn: true, inversions: 1, violations: 1,
			recs: []rawRecord{rec(0, 0, "a", "a2"), rec(0, 1, "a", "a1"), rec(1, 0, "b", "b1"), rec(1, 1, "b", "b2")}},
		{name: "a record no outbox row published, and one under another key", txn: true, foreign: 2, violations: 2,
			recs: append(exactlyOnce[:4:4], rec(0, 2, "a", "zz"), rec(1, 2, "b", "a1"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &verdict{}
			rv := judgeReadCommitted(events, tt.recs, tt.txn, v)
			if rv.duplicates != tt.duplicates || rv.missing != tt.missing || rv.inversions != tt.inversions || rv.foreign != tt.foreign {
				t.Errorf("duplicates %d, gaps %d, inversions %d, other records %d; want %d, %d, %d, %d",
					rv.duplicates, rv.missing, rv.inversions, rv.foreign, tt.duplicates, tt.missing, tt.inversions, tt.foreign)
			}
			if got := v.violations(); got != tt.violations {
				t.Errorf("%d violations, want %d: %+v", got, tt.violations, v.invariants)
			}
		})
	}
}
