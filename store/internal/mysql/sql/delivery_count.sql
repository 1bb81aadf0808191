-- The count of a delivery already counted, tried again in-process. ?1 consumer, ?2 message id.
SELECT COALESCE((SELECT deliveries FROM {{schema}}.inbox_deliveries WHERE consumer = ?1 AND message_id = ?2), 1)
