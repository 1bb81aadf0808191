package outboxkit

import (
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys that outboxkit reads and writes. They travel with the message through the outbox
// row, the broker's headers and into every consumer.
const (
	// MetadataPartitionKey holds the aggregate id. Rows with the same key are published in the order
	// they were written; brokers that partition (Kafka) use it as the message key.
	MetadataPartitionKey = "outboxkit_partition_key"

	// MetadataEventType names the event ("OrderPlaced"), so one topic can carry several types.
	MetadataEventType = "outboxkit_event_type"

	// MetadataCreatedAt is set by the forwarder to the time the outbox row was written
	// (RFC 3339, nanoseconds). Consumers use it for commit-to-effect latency and to recognise a
	// message older than their deduplication window.
	MetadataCreatedAt = "outboxkit_created_at"

	// MetadataContentType is the payload's media type ("application/json"). Backends publish it
	// where the broker has a place for it (RabbitMQ's content_type, CloudEvents' datacontenttype).
	MetadataContentType = "outboxkit_content_type"

	// MetadataVersion holds the aggregate's version after the change the event records (1, 2, 3…
	// per partition key). Optional; the consumer's order guard uses it.
	MetadataVersion = "outboxkit_version"

	// MetadataReplay marks a message sent again by an operator's replay (of a consumer's dead
	// letter): a token unique to that replay. The message keeps its UUID, so every inbox still
	// deduplicates on it, but brokers that drop a re-publish of a known message id (JetStream's
	// Nats-Msg-Id within its DuplicateWindow) see a new id — the UUID and the token — and deliver it.
	MetadataReplay = "outboxkit_replay"

	// MetadataUndecodable marks a message its subscriber could not read (a field or header the
	// broker's wire format cannot parse): why, and where it stood in the broker. Such a message
	// carries no UUID, and its payload and headers as they came; the consumer's stack dead-letters
	// it on its first delivery with this reason. A replay gives it an id, and it is then handled as
	// any other message.
	MetadataUndecodable = "outboxkit_undecodable"

	// MetadataSeq is set by the forwarder to the row's position in the outbox (decimal). It is
	// informative: the per-key order is already the order of publication.
	MetadataSeq = "outboxkit_seq"

	// MetadataTenant names the tenant whose outbox the message came from: set by a relay fleet
	// (package fleet) on every message it publishes, or by the writer. A consumer serving many
	// tenants (middleware.AddTenantConsumerHandler) applies the message in that tenant's database.
	MetadataTenant = "outboxkit_tenant"

	// MetadataOutbox, MetadataLeaseToken and MetadataRelayMember are set by a relay fleet on every
	// message it publishes: the outbox it came from, the fencing token of the lease its publisher
	// held (decimal; it only grows from one owner to the next), and the member that published it.
	// A message whose token is lower than one already seen for its outbox was published by a stale
	// owner.
	MetadataOutbox      = "outboxkit_outbox"
	MetadataLeaseToken  = "outboxkit_lease_token"
	MetadataRelayMember = "outboxkit_relay_member"
)

// Tenant returns the message's tenant (MetadataTenant), or "" when it has none.
func Tenant(msg *message.Message) string { return msg.Metadata.Get(MetadataTenant) }

// SetTenant records the tenant the message belongs to.
func SetTenant(msg *message.Message, tenant string) { msg.Metadata.Set(MetadataTenant, tenant) }

// PartitionKey returns the message's partition key, or "" when it has none.
func PartitionKey(msg *message.Message) string { return msg.Metadata.Get(MetadataPartitionKey) }

// SetPartitionKey sets the aggregate id that orders and partitions the message.
func SetPartitionKey(msg *message.Message, key string) { msg.Metadata.Set(MetadataPartitionKey, key) }

// EventType returns the message's event type, or "" when it has none.
func EventType(msg *message.Message) string { return msg.Metadata.Get(MetadataEventType) }

// SetEventType records the event's type name in the message metadata.
func SetEventType(msg *message.Message, eventType string) {
	msg.Metadata.Set(MetadataEventType, eventType)
}

// SetVersion records the aggregate version the event brings its partition key to.
func SetVersion(msg *message.Message, version int64) {
	msg.Metadata.Set(MetadataVersion, strconv.FormatInt(version, 10))
}

// Version returns the aggregate version recorded with SetVersion. ok is false when there is none
// or it is not a positive integer.
func Version(msg *message.Message) (version int64, ok bool) {
	v, err := strconv.ParseInt(msg.Metadata.Get(MetadataVersion), 10, 64)
	return v, err == nil && v > 0
}

// CreatedAt returns the time the message's outbox row was written, as stamped by the forwarder.
// ok is false when the message did not come through a forwarder or the stamp is malformed.
func CreatedAt(msg *message.Message) (t time.Time, ok bool) {
	raw := msg.Metadata.Get(MetadataCreatedAt)
	if raw == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, raw)
	return t, err == nil
}

// BrokerDedupID is the id under which a broker that deduplicates publishes (JetStream's
// Nats-Msg-Id) should know msg: its UUID, or for a replay (MetadataReplay) the UUID and the replay
// token, so that a replay is never dropped as a re-publish of the original.
func BrokerDedupID(msg *message.Message) string {
	if token := msg.Metadata.Get(MetadataReplay); token != "" {
		return msg.UUID + "/replay/" + token
	}
	return msg.UUID
}
