-- publish: the one call a writer in any language makes in its transaction to put an event in the
-- outbox, with the envelope outboxkit's Go writer gives it (pipeline.NewJSONEvent and
-- Publisher.Publish), so that the relay publishes it and every consumer reads it as it would an
-- event written in Go:
--
--   CALL outboxkit.publish('orders', 'OrderPlaced', 'order-42', '{"id": "order-42"}', NULL, NULL);
--
-- Every argument is positional (a procedure has no defaults): topic and event type, required; the
-- partition key that orders one aggregate's events (NULL or '' for none); the payload, JSON, stored
-- as given; the metadata, a JSON object of strings (traceparent, outboxkit_tenant, headers of your
-- own; NULL for none); the id consumers deduplicate on (NULL: a UUIDv7 is made, as
-- pipeline.NewEvent makes). It returns one row, the id. Bad input is refused with SQLSTATE 45000
-- and a message that says what was wrong, before anything is written; a reused id is MySQL's
-- duplicate entry (1062) on outbox_uuid_key, which names it. MySQL has no NOTIFY: relays poll.
-- docs/tables.md is the contract this procedure and the tables keep.
--
-- A procedure's statements end with ";", so this file sets another delimiter around it, as the
-- mysql client reads one.
DROP PROCEDURE IF EXISTS {{schema}}.publish;

DELIMITER //
CREATE PROCEDURE {{schema}}.publish(
    IN p_topic         TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_event_type    TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_partition_key TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_payload       LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_metadata      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_id            TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
COMMENT 'Writes an event into the outbox in the caller''s transaction; see outboxkit''s docs/tables.md'
BEGIN
    DECLARE v_meta   LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT COALESCE(p_metadata, '{}');
    DECLARE v_key    TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT IF(CHAR_LENGTH(p_partition_key) = 0, NULL, p_partition_key);
    DECLARE v_id     TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT p_id;
    DECLARE v_name   TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_value  TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_names  LONGTEXT;
    DECLARE v_values LONGTEXT;
    DECLARE v_hex    CHAR(32);
    DECLARE v_i      INT DEFAULT 0;

    -- CHAR_LENGTH, not = '': a PAD SPACE collation takes ' ' for ''.
    IF p_topic IS NULL OR CHAR_LENGTH(p_topic) = 0 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: empty topic: name the topic the event goes to, e.g. ''orders''';
    END IF;
    IF LENGTH(p_topic) > 255 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: the topic is over 255 bytes';
    END IF;
    IF p_event_type IS NULL OR CHAR_LENGTH(p_event_type) = 0 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: empty event type: name the event, e.g. ''OrderPlaced''';
    END IF;
    IF LENGTH(p_event_type) > 255 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: the event type is over 255 bytes';
    END IF;
    IF LENGTH(v_key) > 255 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: the partition key is over 255 bytes';
    END IF;
    IF p_payload IS NULL THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: the payload is NULL: pass the event as JSON (''{}'' for none)';
    END IF;
    IF NOT JSON_VALID(p_payload) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: the payload is not JSON: pass the event as a JSON document';
    END IF;

    IF NOT JSON_VALID(v_meta) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: metadata is not JSON: pass a JSON object of strings, or NULL';
    END IF;
    IF JSON_TYPE(v_meta) <> 'OBJECT' THEN
        SET v_value = LEFT(CONCAT('outbox publish: metadata is a JSON ', LOWER(JSON_TYPE(v_meta)), ', not an object of strings'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_value;
    END IF;
    -- JSON_KEYS and $.* list an object's members in the same order.
    SET v_names = JSON_KEYS(v_meta), v_values = JSON_EXTRACT(v_meta, '$.*');
    WHILE v_i < JSON_LENGTH(v_names) DO
        SET v_name = JSON_UNQUOTE(JSON_EXTRACT(v_names, CONCAT('$[', v_i, ']')));
        IF CHAR_LENGTH(v_name) = 0 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: metadata has an empty key';
        END IF;
        IF JSON_TYPE(JSON_EXTRACT(v_values, CONCAT('$[', v_i, ']'))) <> 'STRING' THEN
            SET v_value = LEFT(CONCAT('outbox publish: metadata "', v_name, '" is not a string: every metadata value is text'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_value;
        END IF;
        SET v_i = v_i + 1;
    END WHILE;
    SET v_value = JSON_UNQUOTE(JSON_EXTRACT(v_meta, '$.outboxkit_event_type'));
    IF v_value IS NOT NULL AND v_value <> p_event_type THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: metadata outboxkit_event_type differs from the event type: pass it once';
    END IF;
    SET v_value = JSON_UNQUOTE(JSON_EXTRACT(v_meta, '$.outboxkit_partition_key'));
    IF v_value IS NOT NULL AND NOT (v_value <=> COALESCE(v_key, '')) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: metadata outboxkit_partition_key differs from the partition key: pass it once';
    END IF;
    SET v_value = JSON_UNQUOTE(JSON_EXTRACT(v_meta, '$.outboxkit_version'));
    IF v_value IS NOT NULL AND NOT v_value REGEXP '^[1-9][0-9]{0,18}$' THEN
        SET v_value = LEFT(CONCAT('outbox publish: metadata outboxkit_version "', v_value, '" is not a positive integer'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_value;
    END IF;
    -- The trace context as the relay and the consumers read it (W3C Trace Context): a malformed one
    -- would be dropped there without a word, and the event's trace broken.
    SET v_value = JSON_UNQUOTE(JSON_EXTRACT(v_meta, '$.traceparent'));
    IF v_value IS NOT NULL AND (NOT v_value REGEXP '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
        OR LEFT(v_value, 2) = 'ff' OR (LEFT(v_value, 2) = '00' AND CHAR_LENGTH(v_value) <> 55)
        OR SUBSTR(v_value, 4, 32) = REPEAT('0', 32) OR SUBSTR(v_value, 37, 16) = REPEAT('0', 16)) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: metadata traceparent is not a W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>';
    END IF;

    IF v_id IS NULL THEN
        -- A UUIDv7 (RFC 9562): the time in milliseconds, version 7, random bits with the variant
        -- set, so that the outbox's and the inboxes' keys grow at their right edge.
        SET v_hex = MD5(CONCAT(UUID(), RAND(), CONNECTION_ID()));
        SET v_hex = CONCAT(LPAD(HEX(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000)), 12, '0'), '7', SUBSTR(v_hex, 1, 3),
            HEX(8 + CONV(SUBSTR(v_hex, 4, 1), 16, 10) % 4), SUBSTR(v_hex, 5, 15));
        SET v_id = LOWER(CONCAT(SUBSTR(v_hex, 1, 8), '-', SUBSTR(v_hex, 9, 4), '-', SUBSTR(v_hex, 13, 4), '-',
            SUBSTR(v_hex, 17, 4), '-', SUBSTR(v_hex, 21, 12)));
    ELSEIF CHAR_LENGTH(v_id) = 0 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: empty id: pass NULL to have one made, or an id unique to the event';
    ELSEIF LENGTH(v_id) > 255 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox publish: the id is over 255 bytes';
    END IF;

    -- The event type and the content type travel in the metadata; the partition key has a column
    -- of its own, which the relay puts back into what it publishes.
    SET v_meta = JSON_SET(JSON_REMOVE(v_meta, '$.outboxkit_partition_key'), '$.outboxkit_event_type', p_event_type);
    IF JSON_EXTRACT(v_meta, '$.outboxkit_content_type') IS NULL THEN
        SET v_meta = JSON_SET(v_meta, '$.outboxkit_content_type', 'application/json');
    END IF;

    INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, metadata, created_at)
    VALUES (v_id, p_topic, v_key, p_payload, v_meta, UTC_TIMESTAMP(6));
    SELECT v_id AS id;
END //
DELIMITER ;
