package forwarder

import "time"

// BinlogStatus is a binlog relay group (package forwarder/mysqlbinlog) as its checkpoint and the
// server tell it: what prom.NewBinlogCollector exports and outboxctl status shows.
//
// It is not a SlotStatus: MySQL and MariaDB keep no replication slot for a relay. The checkpoint
// is the relay group's own row (table binlog_relays, in the outbox's database), and the server
// purges its binary logs by their age or size whether a relay has read them or not — so where a
// slot is missing or lost, a binlog relay's checkpoint is purged.
type BinlogStatus struct {
	Relay    string // the relay group: the forwarder's Name
	Database string // the outbox's database, which holds the checkpoint
	// Progress is how the checkpoint tracks the group's progress: "gtid" (the GTID set read up to)
	// or "file" (the binary log file and position). Empty before the group's first start recorded
	// its checkpoint.
	Progress string
	// Position is the checkpoint: the GTID set read up to with "gtid", file:pos with "file".
	Position string
	// File and Pos are where the last transaction behind the checkpoint ends in the binary log,
	// whatever the Progress: what LagBytes and Purged are measured from.
	File string
	Pos  uint64
	// CheckpointAt is when the checkpoint was last recorded (UTC), zero before the group's first
	// start; CheckpointAge is how long ago, by the server's clock. A relay records one every
	// FlushInterval while it publishes rows or passes other writes in the binary log, and none
	// while the server writes nothing: on an idle server the age grows while all is well.
	CheckpointAt  time.Time
	CheckpointAge time.Duration
	// Active is set while a relay of the group holds the group's lock: it reads the binary log, or
	// is starting to. The relays waiting for it (standbys) do not hold it.
	Active bool
	// Paused is set while an operator pauses the relay group (store.PauseRelay, by its Name): it
	// publishes nothing, its checkpoint stays where it was, and LagBytes grows with every write
	// to the server.
	Paused bool
	// LagBytes is the binary log the server has written since the checkpoint: the rest of the
	// checkpoint's file and every later file. It is never quite 0: the checkpoint's own write
	// follows it. -1 when unknown: before the first checkpoint, when Purged, or when the
	// binary logs could not be listed (LogError says why).
	LagBytes int64
	// Purged is set when the checkpoint's file is no longer among the server's binary logs
	// (expired by binlog_expire_logs_seconds, PURGE BINARY LOGS, or another server after a
	// failover): the relay cannot read on from its checkpoint, and its next start recovers from the
	// table (the rows left in the outbox, then the log from its end).
	Purged bool
	// LogError says why the server's binary logs could not be listed (SHOW BINARY LOGS): most
	// often the user lacks BINLOG MONITOR (REPLICATION CLIENT on MySQL), and it says which GRANT
	// gives it. LagBytes is then -1 and Purged false. Empty when they were read.
	LogError string
}
