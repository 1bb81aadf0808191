package pipeline_test

// Publishing and migrating against real databases are tested by the store conformance suite
// (store/storetest), once per store driver.

import (
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/pipeline"
)

func TestPartitionKeyHelpers(t *testing.T) {
	msg := pipeline.NewEvent("OrderPlaced", "order-1", nil)
	if outboxkit.PartitionKey(msg) != "order-1" || outboxkit.EventType(msg) != "OrderPlaced" {
		t.Fatalf("metadata = %v", msg.Metadata)
	}
	if len(msg.UUID) != 36 || msg.UUID[14] != '7' {
		t.Fatalf("UUID %q is not a version 7 UUID", msg.UUID)
	}
	if pipeline.NewEvent("E", "", nil).Metadata.Get(outboxkit.MetadataPartitionKey) != "" {
		t.Fatal("empty key stored")
	}
}

func TestNewPublisherSaysWhatIsMissing(t *testing.T) {
	if _, err := pipeline.NewPublisher[any](nil, nil, pipeline.PublisherConfig{}); err == nil || !strings.Contains(err.Error(), "store") {
		t.Fatalf("got %v, want an error naming the missing store", err)
	}
}
