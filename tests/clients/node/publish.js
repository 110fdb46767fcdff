// Publishes messages with Node's amqplib, as a producer written in JavaScript would, for
// tests/integration/test_other_clients.py. Reads one JSON document on stdin:
//   {"url": "amqp://...", "messages": [{"exchange": "...", "routingKey": "...",
//     "body": "<base64>", "options": {...amqplib publish options...}}]}
// Options go to channel.publish as given, with amqplib's own defaults for anything absent.
// A header value {"!bytes": "<base64>"} becomes a Buffer (a byte array, 'x'); typed values use
// amqplib's {"!": "int64", "value": ...} notation. Every message is confirmed before exit 0.
'use strict';

const amqp = require('amqplib');

function revive(value) {
  if (Array.isArray(value)) return value.map(revive);
  if (value && typeof value === 'object') {
    if (Object.hasOwn(value, '!bytes')) return Buffer.from(value['!bytes'], 'base64');
    if (Object.hasOwn(value, '!')) return value;
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, revive(v)]));
  }
  return value;
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

async function main() {
  const spec = await readStdin();
  const connection = await amqp.connect(spec.url);
  try {
    const channel = await connection.createConfirmChannel();
    for (const m of spec.messages) {
      const options = { ...m.options };
      if (options.headers) options.headers = revive(options.headers);
      channel.publish(m.exchange, m.routingKey, Buffer.from(m.body, 'base64'), options);
    }
    await channel.waitForConfirms();
    await channel.close();
  } finally {
    await connection.close();
  }
  process.stdout.write(`published ${spec.messages.length}\n`);
}

main().catch((err) => {
  process.stderr.write(`node publisher: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
