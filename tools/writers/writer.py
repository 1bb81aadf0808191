#!/usr/bin/env python3
"""An order service in Python on Debian's psycopg2, writing its events through outboxkit's tables
contract (docs/tables.md) with no outboxkit code: the order row and its event commit in one
transaction, the event written by the schema's publish function.

    python3 writer.py URL SCHEMA TOPIC COMMIT_ORDER ROLLBACK_ORDER TRACEPARENT

places COMMIT_ORDER and commits, places ROLLBACK_ORDER and rolls it back, and prints the id publish
gave the committed event. Orders go to SCHEMA.orders (id, writer, total).
"""
import json
import re
import sys

import psycopg2

WRITER = "python"


def place_order(conn, schema, topic, order_id, traceparent, commit):
    """Writes the order and its OrderPlaced event in one transaction, committed or rolled back, and
    returns the event's id."""
    try:
        with conn.cursor() as cur:
            cur.execute(f'INSERT INTO "{schema}".orders (id, writer, total) VALUES (%s, %s, 42)', (order_id, WRITER))
            cur.execute(
                f"SELECT \"{schema}\".publish(%s, 'OrderPlaced', %s, %s, %s)",
                (
                    topic,
                    order_id,  # the partition key: the order's events are published in the order written
                    json.dumps({"order_id": order_id, "total": 42, "writer": WRITER}, separators=(",", ":")),
                    json.dumps({"traceparent": traceparent, "x_writer": WRITER}),
                ),
            )
            (event_id,) = cur.fetchone()
    except BaseException:
        conn.rollback()
        raise
    if commit:
        conn.commit()
    else:
        conn.rollback()
    return event_id


def main(argv):
    if len(argv) != 7:
        print("usage: python3 writer.py URL SCHEMA TOPIC COMMIT_ORDER ROLLBACK_ORDER TRACEPARENT", file=sys.stderr)
        return 2
    url, schema, topic, commit_order, rollback_order, traceparent = argv[1:]
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,49}", schema):
        print(f"schema name {schema!r} is not usable", file=sys.stderr)
        return 2
    conn = psycopg2.connect(url)
    try:
        event_id = place_order(conn, schema, topic, commit_order, traceparent, commit=True)
        place_order(conn, schema, topic, rollback_order, traceparent, commit=False)
    finally:
        conn.close()
    print(event_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
