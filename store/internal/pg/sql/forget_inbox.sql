-- A parked message dead-lettered when its turn came is forgotten by the inbox, so that its replay
-- runs. $1 consumer, $2 message id.
DELETE FROM {{schema}}.inbox WHERE consumer = $1 AND message_id = $2
