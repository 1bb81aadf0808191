package forwarder

// SlotStatus is a replication slot as a log relay (package forwarder/pglog) reports it: what
// prom.NewSlotCollector exports and outboxctl status shows.
type SlotStatus struct {
	Relay string // the relay group: the forwarder's Name
	Slot  string // the replication slot's name
	Mode  string // the writers' mode: "table" or "wal"

	Exists bool // false: the slot is missing (dropped, or lost in a failover)
	Active bool // a relay reads it now
	// WALStatus is the server's: "reserved", "extended", "unreserved" (past max_wal_size, to be
	// invalidated at the next checkpoint unless read), "lost" (invalidated: past
	// max_slot_wal_keep_size). Empty when the slot is missing.
	WALStatus string
	// LagBytes is the WAL written since the slot's confirmed position: how far behind the server
	// the relay's confirmation is.
	LagBytes int64
	// RetainedBytes is the WAL the slot keeps from removal, since its restart position.
	RetainedBytes int64
	// SafeWALBytes is how much more WAL can be written before the slot is invalidated; -1 when
	// max_slot_wal_keep_size is unlimited.
	SafeWALBytes int64
	// ConfirmedLSN is the slot's confirmed position ("" when missing).
	ConfirmedLSN string
	// ParkedKeys is, for the relay that reports it, how many partition keys back off after a
	// failure of their oldest event, holding their later events (and the confirmed position). 0 when
	// read by an operator's tool.
	ParkedKeys int
	// Paused is set while an operator pauses the relay group (store.PauseRelay, by its Name): it
	// publishes nothing, and the slot's confirmed position stays where it was, so LagBytes grows
	// with every write to the database until it is resumed.
	Paused bool
	// HeldEvents is, for the relay that reports it, how many events it holds read but unpublished
	// because of a pause: of a paused topic, behind one of their key, or all while the relay is
	// paused. They hold the confirmed position. 0 when read by an operator's tool.
	HeldEvents int
}
