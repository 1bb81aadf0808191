-- publish: the one call a writer in any language makes in its transaction to put an event in the
-- outbox, with the envelope outboxkit's Go writer gives it (pipeline.NewJSONEvent and
-- Publisher.Publish), so that the relay publishes it and every consumer reads it as it would an
-- event written in Go:
--
--   SELECT {{schema}}.publish('orders', 'OrderPlaced', 'order-42', '{"id": "order-42"}');
--
-- topic and event_type are required; partition_key orders the events of one aggregate (NULL or ''
-- for none); payload is the event as JSON, stored as given; metadata is a JSON object of strings
-- that travels with the event (W3C traceparent and tracestate, outboxkit_tenant, outboxkit_version,
-- headers of your own); id is the message id consumers deduplicate on, made here (a UUIDv7, as
-- pipeline.NewEvent makes) when NULL. It returns the id. Bad input is refused before anything is
-- written, with an error that says what was wrong; a reused id is a unique_violation (23505) on
-- outbox_uuid_key that names it. The relays are woken at commit (NOTIFY, unless one is awake), as
-- the Go writer wakes them. docs/tables.md is the contract this function and the tables keep.
CREATE FUNCTION {{schema}}.publish(
    topic         text,
    event_type    text,
    partition_key text,
    payload       json,
    metadata      jsonb DEFAULT '{}',
    id            text  DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    meta        jsonb := coalesce(publish.metadata, '{}'::jsonb);
    message_id  text  := publish.id;
    ordering    text  := nullif(publish.partition_key, '');
    stored_id   uuid;
    stored_text text;
    bad         record;
    traceparent text;
BEGIN
    IF publish.topic IS NULL OR publish.topic = '' THEN
        RAISE EXCEPTION 'outbox publish: empty topic: name the topic the event goes to, e.g. ''orders'''
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(publish.topic) > 255 THEN
        RAISE EXCEPTION 'outbox publish: topic is % bytes; at most 255', octet_length(publish.topic)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF publish.event_type IS NULL OR publish.event_type = '' THEN
        RAISE EXCEPTION 'outbox publish: empty event type: name the event, e.g. ''OrderPlaced'': consumers tell events apart by it'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(publish.event_type) > 255 THEN
        RAISE EXCEPTION 'outbox publish: event type is % bytes; at most 255', octet_length(publish.event_type)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(ordering) > 255 THEN
        RAISE EXCEPTION 'outbox publish: partition key is % bytes; at most 255', octet_length(ordering)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A payload that is not JSON never gets here: the json parameter refuses it as the call is made.
    IF publish.payload IS NULL THEN
        RAISE EXCEPTION 'outbox publish: the payload is NULL: pass the event as JSON (''{}'' for an event without a body)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF jsonb_typeof(meta) <> 'object' THEN
        RAISE EXCEPTION 'outbox publish: metadata is a JSON %, not an object of strings', jsonb_typeof(meta)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF meta ? '' THEN
        RAISE EXCEPTION 'outbox publish: metadata has an empty key' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- An expression, not a query, on the way every valid call takes; the query only names the key.
    IF jsonb_path_exists(meta, '$.* ? (@.type() != "string")') THEN
        SELECT m.key, jsonb_typeof(m.value) AS type INTO bad FROM jsonb_each(meta) AS m
        WHERE jsonb_typeof(m.value) <> 'string' LIMIT 1;
        RAISE EXCEPTION 'outbox publish: metadata "%" is a JSON %, not a string: every metadata value is text (write numbers as strings)',
            bad.key, bad.type USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF meta ->> 'outboxkit_event_type' <> publish.event_type THEN
        RAISE EXCEPTION 'outbox publish: metadata outboxkit_event_type is "%" but event_type is "%": pass the type once, as event_type',
            meta ->> 'outboxkit_event_type', publish.event_type USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF meta ->> 'outboxkit_partition_key' <> coalesce(ordering, '') THEN
        RAISE EXCEPTION 'outbox publish: metadata outboxkit_partition_key is "%" but partition_key is %: pass the key once, as partition_key',
            meta ->> 'outboxkit_partition_key', coalesce('"' || ordering || '"', 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF meta ->> 'outboxkit_version' !~ '^[1-9][0-9]{0,18}$' THEN
        RAISE EXCEPTION 'outbox publish: metadata outboxkit_version is "%", not a positive integer (the aggregate''s version after this event)',
            meta ->> 'outboxkit_version' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The trace context as the relay and the consumers read it (W3C Trace Context): a malformed one
    -- would be dropped there without a word, and the event's trace broken.
    traceparent := meta ->> 'traceparent';
    IF traceparent IS NOT NULL AND (
        traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
        OR left(traceparent, 2) = 'ff' OR (left(traceparent, 2) = '00' AND length(traceparent) <> 55)
        OR substr(traceparent, 4, 32) = repeat('0', 32) OR substr(traceparent, 37, 16) = repeat('0', 16)) THEN
        RAISE EXCEPTION 'outbox publish: metadata traceparent "%" is not a W3C trace context (00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, lowercase, ids not zero)',
            traceparent USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF message_id IS NULL THEN
        -- A UUIDv7 (RFC 9562): the time in milliseconds, then random bits, version 7 and the
        -- variant set, so that the outbox's and the inboxes' keys grow at their right edge.
        stored_id := encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
            PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
            FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid;
        message_id := stored_id::text;
    ELSIF message_id = '' THEN
        RAISE EXCEPTION 'outbox publish: empty id: pass NULL to have one made, or an id unique to this event'
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(message_id) > 255 THEN
        RAISE EXCEPTION 'outbox publish: id is % bytes; at most 255', octet_length(message_id)
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF message_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        stored_id := message_id::uuid;
    ELSE
        -- Any other id is kept as its text, keyed by its md5, as the Go writer keeps it (0006).
        stored_id := md5(message_id)::uuid;
        stored_text := message_id;
    END IF;

    -- The event type and the content type travel in the metadata; the partition key has a
    -- column of its own, which the relay puts back into what it publishes.
    meta := meta - 'outboxkit_partition_key'::text || jsonb_build_object('outboxkit_event_type', publish.event_type);
    IF NOT meta ? 'outboxkit_content_type' THEN
        meta := meta || '{"outboxkit_content_type": "application/json"}'::jsonb;
    END IF;

    INSERT INTO {{schema}}.outbox (uuid, uuid_text, topic, partition_key, payload, metadata)
    VALUES (stored_id, stored_text, publish.topic, ordering, convert_to(publish.payload::text, 'UTF8'), meta::text)
    ON CONFLICT (uuid) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox publish: id "%" is already in the outbox: every event needs an id of its own (pass NULL to have one made)',
            message_id USING ERRCODE = 'unique_violation', CONSTRAINT = 'outbox_uuid_key', SCHEMA = '{{schema_name}}', TABLE = 'outbox';
    END IF;

    -- As the Go writer's INSERT: wake the relays at commit, unless one says it is awake and polling
    -- (a NOTIFY serialises the commits of the transactions that send one).
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.relay_awake WHERE awake_until > clock_timestamp()) THEN
        PERFORM pg_notify('{{notify_channel}}', '');
    END IF;
    RETURN message_id;
END
$$;

COMMENT ON FUNCTION {{schema}}.publish(text, text, text, json, jsonb, text) IS
    'Writes an event into the outbox in the caller''s transaction: publish(topic, event_type, partition_key, payload json, metadata jsonb default ''{}'', id default NULL: made) returns the id. See outboxkit''s docs/tables.md.';
