// An order service in Node.js on the stock pg, writing its events through outboxkit's tables
// contract (docs/tables.md) with no outboxkit code: the order row and its event commit in one
// transaction, the event written by the schema's publish function.
//
//   node writer.js URL SCHEMA TOPIC COMMIT_ORDER ROLLBACK_ORDER TRACEPARENT
//
// places COMMIT_ORDER and commits, places ROLLBACK_ORDER and rolls it back, and prints the id
// publish gave the committed event. Orders go to SCHEMA.orders (id, writer, total).
'use strict';
const { Client } = require('pg');

const WRITER = 'node';

// placeOrder writes the order and its OrderPlaced event in one transaction, committed or rolled
// back, and returns the event's id.
async function placeOrder(client, schema, topic, orderId, traceparent, commit) {
  await client.query('BEGIN');
  try {
    await client.query(`INSERT INTO "${schema}".orders (id, writer, total) VALUES ($1, $2, 42)`, [orderId, WRITER]);
    const { rows } = await client.query(`SELECT "${schema}".publish($1, 'OrderPlaced', $2, $3, $4) AS id`, [
      topic,
      orderId, // the partition key: the order's events are published in the order they were written
      JSON.stringify({ order_id: orderId, total: 42, writer: WRITER }),
      JSON.stringify({ traceparent, x_writer: WRITER }),
    ]);
    await client.query(commit ? 'COMMIT' : 'ROLLBACK');
    return rows[0].id;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  }
}

async function main(argv) {
  if (argv.length !== 6) {
    console.error('usage: node writer.js URL SCHEMA TOPIC COMMIT_ORDER ROLLBACK_ORDER TRACEPARENT');
    process.exit(2);
  }
  const [url, schema, topic, commitOrder, rollbackOrder, traceparent] = argv;
  if (!/^[a-z_][a-z0-9_]{0,49}$/.test(schema)) throw new Error(`schema name ${JSON.stringify(schema)} is not usable`);
  const client = new Client({ connectionString: url });
  await client.connect();
  try {
    const id = await placeOrder(client, schema, topic, commitOrder, traceparent, true);
    await placeOrder(client, schema, topic, rollbackOrder, traceparent, false);
    process.stdout.write(id + '\n');
  } finally {
    await client.end();
  }
}

main(process.argv.slice(2)).catch((err) => {
  console.error(err.message || err);
  process.exit(1);
});
