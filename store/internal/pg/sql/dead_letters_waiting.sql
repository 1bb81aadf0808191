-- Dead letters of consumer $1 not yet replayed, and when the oldest was dead-lettered (dead_letters_console_consumer_idx).
SELECT count(*), min(dead_lettered_at) FROM {{schema}}.dead_letters WHERE consumer = $1 AND replayed_at IS NULL
  AND archived_at IS NULL
