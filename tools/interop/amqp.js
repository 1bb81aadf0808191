// A RabbitMQ client outboxkit does not control, for the interoperability tests (stock amqplib):
//
//   node amqp.js produce URL EXCHANGE    reads JSON lines {body, options} on stdin and publishes
//                                        each to EXCHANGE with those amqplib publish options
//                                        (messageId, type, contentType, headers …), with confirms
//   node amqp.js consume URL QUEUE N     prints N deliveries of QUEUE as JSON lines
//                                        {body, properties, headers}, acking each, then exits
'use strict';
const amqp = require('amqplib');
const readline = require('readline');

async function produce(url, exchange) {
  const conn = await amqp.connect(url);
  const ch = await conn.createConfirmChannel();
  await ch.assertExchange(exchange, 'fanout', { durable: true });
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const { body, options } = JSON.parse(line);
    ch.publish(exchange, '', Buffer.from(body), { persistent: true, ...options });
  }
  await ch.waitForConfirms();
  await conn.close();
}

async function consume(url, queue, n) {
  const conn = await amqp.connect(url);
  const ch = await conn.createChannel();
  await ch.prefetch(16);
  let seen = 0;
  await new Promise((resolve) => {
    ch.consume(queue, (msg) => {
      if (msg === null) return;
      const { headers, ...properties } = msg.properties;
      if (properties.timestamp !== undefined) properties.timestamp = Number(properties.timestamp);
      process.stdout.write(JSON.stringify({ body: msg.content.toString(), properties, headers }) + '\n');
      ch.ack(msg);
      if (++seen >= n) resolve();
    });
  });
  await conn.close();
}

const [mode, url, target, n] = process.argv.slice(2);
const run = mode === 'produce' ? produce(url, target) : mode === 'consume' ? consume(url, target, Number(n)) : null;
if (!run) {
  console.error('usage: node amqp.js produce URL EXCHANGE | consume URL QUEUE N');
  process.exit(2);
}
run.catch((err) => {
  console.error(err);
  process.exit(1);
});
