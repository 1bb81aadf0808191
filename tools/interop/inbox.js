// A consumer in Node.js on the stock amqplib and pg that applies each event once through
// outboxkit's inbox contract (docs/tables.md), with no outboxkit code: in one transaction, the
// inbox row first (INSERT … ON CONFLICT DO NOTHING), then the effect only if the row is new; a
// delivery whose row is there already is a duplicate, counted and acknowledged.
//
//   node inbox.js AMQP_URL QUEUE PG_URL SCHEMA CONSUMER N [--exit-after-first-commit]
//
// handles N deliveries of QUEUE, one at a time, printing each as a JSON line {id, redelivered,
// applied}, then exits. The effect is a row in SCHEMA.effects (consumer, message_id, pkey, seq).
// --exit-after-first-commit exits after the first delivery's transaction commits, before it is
// acknowledged, as a consumer that crashes there: the broker delivers it again.
'use strict';
const amqp = require('amqplib');
const { Client } = require('pg');

// handle applies one delivery in one transaction and tells whether it was applied (false: a
// duplicate the inbox absorbed).
async function handle(db, schema, consumer, msg) {
  const id = msg.properties.messageId;
  if (!id) throw new Error('a delivery without a message id: outboxkit sets it to the event id');
  const headers = msg.properties.headers || {};
  await db.query('BEGIN');
  try {
    // The inbox row first: a concurrent delivery of the same event waits on it, then conflicts.
    const inbox = await db.query(
      `INSERT INTO "${schema}".inbox (consumer, message_id, processed_at) VALUES ($1, $2, now()) ON CONFLICT DO NOTHING`,
      [consumer, id],
    );
    const applied = inbox.rowCount === 1;
    if (applied) {
      await db.query(`INSERT INTO "${schema}".effects (consumer, message_id, pkey, seq) VALUES ($1, $2, $3, $4)`, [
        consumer,
        id,
        String(headers.outboxkit_partition_key || ''),
        Number(headers.outboxkit_seq || 0),
      ]);
    } else {
      await db.query(`UPDATE "${schema}".inbox SET duplicates = duplicates + 1 WHERE consumer = $1 AND message_id = $2`, [
        consumer,
        id,
      ]);
    }
    await db.query('COMMIT');
    return applied;
  } catch (err) {
    await db.query('ROLLBACK');
    throw err;
  }
}

async function main(argv) {
  const exitAfterFirstCommit = argv.includes('--exit-after-first-commit');
  const args = argv.filter((a) => a !== '--exit-after-first-commit');
  if (args.length !== 6) {
    console.error('usage: node inbox.js AMQP_URL QUEUE PG_URL SCHEMA CONSUMER N [--exit-after-first-commit]');
    process.exit(2);
  }
  const [amqpURL, queue, pgURL, schema, consumer, n] = args;
  if (!/^[a-z_][a-z0-9_]{0,49}$/.test(schema)) throw new Error(`schema name ${JSON.stringify(schema)} is not usable`);
  const db = new Client({ connectionString: pgURL });
  await db.connect();
  const conn = await amqp.connect(amqpURL);
  const ch = await conn.createChannel();
  await ch.prefetch(1); // one delivery at a time: the next waits for this one's ack
  let handled = 0;
  await new Promise((resolve, reject) => {
    ch.consume(queue, (msg) => {
      if (msg === null) return reject(new Error(`queue ${queue} was cancelled`));
      handle(db, schema, consumer, msg).then((applied) => {
        const line = { id: msg.properties.messageId, redelivered: msg.fields.redelivered, applied };
        process.stdout.write(JSON.stringify(line) + '\n');
        if (exitAfterFirstCommit) process.exit(3); // committed, never acknowledged
        ch.ack(msg);
        if (++handled >= Number(n)) resolve();
      }, reject);
    });
  });
  // The channel first: its close is answered after the acks before it, which a connection's close
  // alone may drop.
  await ch.close();
  await conn.close();
  await db.end();
}

main(process.argv.slice(2)).catch((err) => {
  console.error(err.message || err);
  process.exit(1);
});
