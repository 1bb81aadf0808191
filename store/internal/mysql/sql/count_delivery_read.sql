-- ?1 consumer, ?2 message id.
SELECT deliveries FROM {{schema}}.inbox_deliveries WHERE consumer = ?1 AND message_id = ?2
