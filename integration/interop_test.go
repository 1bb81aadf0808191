package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

// writeJSONEvents commits one OrderPlaced event per key, as the order service would.
func writeJSONEvents(t *testing.T, pg *testenv.PG, topic string, keys ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := pipeline.NewPublisher(pg.Store, tx, pipeline.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		msg, err := pipeline.NewJSONEvent("OrderPlaced", k, map[string]string{"order_id": k})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func drainRelay(t *testing.T, pg *testenv.PG, b *backends.Backend) {
	t.Helper()
	relay := newRelay(t, pgDB(pg), b.Publisher)
	for {
		res, err := relay.DispatchBatch(context.Background())
		if err != nil || res.UnreachableErr != nil || res.Failed > 0 {
			t.Fatalf("dispatch: %+v %v", res, err)
		}
		if res.Claimed == 0 {
			return
		}
	}
}

// A Node.js service on the stock amqplib produces into outboxkit's inbox stack: one message that
// sets only messageId (and type, contentType), one CloudEvent in the AMQP binding's binary mode,
// and the first one again. Both are applied once, the repeat is absorbed, nothing is dead-lettered.
func TestInterop_NodeAMQPProducerIntoTheInbox(t *testing.T) {
	t.Parallel()
	node, script := testenv.NodeAMQP(t)
	pg := testenv.NewPG(t)
	createEffects(t, pgDB(pg))
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "node") + ".placed"
	testenv.DeclareQueue(t, url, topic, "billing")
	b := openBackend(t, url, backends.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	startEffectConsumer(t, ctx, pgDB(pg), b, topic, "billing")

	plain := `{"body":"{\"order_id\":\"o-1\"}","options":{"messageId":"node-1","type":"OrderPlaced","contentType":"application/json"}}`
	ce := `{"body":"{\"order_id\":\"o-2\"}","options":{"contentType":"application/json","headers":{"cloudEvents:specversion":"1.0",` +
		`"cloudEvents:id":"node-ce-2","cloudEvents:type":"OrderPlaced","cloudEvents:source":"/node/orders","cloudEvents:partitionkey":"o-2"}}}`
	cmd := exec.Command(node, script, "produce", url, topic)
	cmd.Stdin = strings.NewReader(plain + "\n" + ce + "\n" + plain + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node producer: %v\n%s", err, out)
	}
	testenv.Eventually(t, 30*time.Second, "both Node.js messages to be applied and the repeat absorbed", func() bool {
		return countEffects(t, pgDB(pg), "billing") == 2 && pg.Int(t, `SELECT coalesce(sum(duplicates), 0) FROM {{schema}}.inbox`) == 1
	})
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters`); n != 0 {
		t.Fatalf("%d messages dead-lettered: a message without Watermill's UUID header must be read by its message_id or CloudEvents id", n)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.effects WHERE (message_id, pkey) IN (('node-1', ''), ('node-ce-2', 'o-2'))`); n != 2 {
		t.Fatalf("the effects do not carry the producers' ids and partition key")
	}
}

// What the forwarder sends to RabbitMQ with CloudEvents on, read by a Node.js consumer on the stock
// amqplib: message_id, type, content_type, timestamp, and the binding's cloudEvents:* properties.
func TestInterop_ForwarderToNodeAMQPConsumer(t *testing.T) {
	t.Parallel()
	node, script := testenv.NodeAMQP(t)
	pg := testenv.NewPG(t)
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "tonode") + ".placed"
	testenv.DeclareQueue(t, url, topic, "node")
	b := openBackend(t, url, backends.Options{CloudEvents: true, CloudEventsSource: "/orders"})
	writeJSONEvents(t, pg, topic, "o-1")
	drainRelay(t, pg, b)
	uuid := ""
	if err := pg.Pool.QueryRow(context.Background(), pg.Schema.Render(`SELECT uuid FROM {{schema}}.outbox`)).Scan(&uuid); err != nil {
		t.Fatal(err)
	}

	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, node, script, "consume", url, topic+"_node", "1").Output()
	if err != nil {
		t.Fatalf("node consumer: %v", err)
	}
	var got struct {
		Body       string
		Properties map[string]any
		Headers    map[string]any
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &got); err != nil {
		t.Fatalf("node consumer printed %q: %v", out, err)
	}
	p, h := got.Properties, got.Headers
	if p["messageId"] != uuid || p["type"] != "OrderPlaced" || p["contentType"] != "application/json" || p["timestamp"] == nil {
		t.Errorf("AMQP properties %v: want messageId %s, type OrderPlaced, contentType application/json, a timestamp", p, uuid)
	}
	want := map[string]string{"cloudEvents:id": uuid, "cloudEvents:type": "OrderPlaced", "cloudEvents:specversion": "1.0",
		"cloudEvents:source": "/orders", "cloudEvents:partitionkey": "o-1"}
	for k, v := range want {
		if fmt.Sprint(h[k]) != v {
			t.Errorf("application property %s = %v, want %s", k, h[k], v)
		}
	}
	if _, ok := h["cloudEvents:time"]; !ok {
		t.Errorf("no cloudEvents:time in %v", h)
	}
	if got.Body != `{"order_id":"o-1"}` {
		t.Errorf("body %q", got.Body)
	}
}

// kcat (librdkafka) produces a CloudEvent in the Kafka binding's binary mode into outboxkit's inbox
// stack, keyed by its partition key; and reads what the forwarder sends with CloudEvents on.
func TestInterop_KcatBothWays(t *testing.T) {
	t.Parallel()
	kcat := testenv.Kcat(t)
	url := testenv.KafkaURL(t)
	broker := strings.TrimPrefix(url, "kafka://")

	t.Run("kcat produces into the inbox", func(t *testing.T) {
		t.Parallel()
		pg := testenv.NewPG(t)
		createEffects(t, pgDB(pg))
		topic := testenv.UniqueName(t, "kcatin") + ".placed"
		group := testenv.UniqueName(t, "g")
		b := openBackend(t, url, kafkaOpts)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		startEffectConsumer(t, ctx, pgDB(pg), b, topic, group)
		// Written now: an event older than the inbox's dedup window is dead-lettered as a possible
		// duplicate, so a fixed date would fail this test once it is a week old.
		written := time.Now().UTC().Format(time.RFC3339)
		for i, id := range []string{"kcat-1", "kcat-2", "kcat-1"} { // the last one is a redelivery
			cmd := exec.Command(kcat, "-P", "-b", broker, "-t", topic, "-k", fmt.Sprintf("o-%d", i%2+1),
				"-H", "ce_specversion=1.0", "-H", "ce_id="+id, "-H", "ce_type=OrderPlaced", "-H", "ce_source=/kcat",
				"-H", "ce_time="+written, "-H", "content-type=application/json")
			cmd.Stdin = strings.NewReader(`{"order_id":"x"}` + "\n")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("kcat -P: %v\n%s", err, out)
			}
		}
		testenv.Eventually(t, 60*time.Second, "both kcat events applied and the repeat absorbed", func() bool {
			return countEffects(t, pgDB(pg), group) == 2 && pg.Int(t, `SELECT coalesce(sum(duplicates), 0) FROM {{schema}}.inbox`) == 1
		})
		if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.effects WHERE (message_id, pkey) IN (('kcat-1', 'o-1'), ('kcat-2', 'o-2'))`); n != 2 {
			t.Fatalf("the effects do not carry kcat's ids and record keys")
		}
		if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters`); n != 0 {
			t.Fatalf("%d messages dead-lettered", n)
		}
	})

	t.Run("kcat reads the forwarder", func(t *testing.T) {
		t.Parallel()
		pg := testenv.NewPG(t)
		topic := testenv.UniqueName(t, "kcatout") + ".placed"
		b := openBackend(t, url, backends.Options{CloudEvents: true})
		writeJSONEvents(t, pg, topic, "o-7")
		drainRelay(t, pg, b)
		uuid := ""
		if err := pg.Pool.QueryRow(context.Background(), pg.Schema.Render(`SELECT uuid FROM {{schema}}.outbox`)).Scan(&uuid); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(cctx, kcat, "-C", "-b", broker, "-t", topic, "-o", "beginning", "-c", "1", "-e", "-J").Output()
		if err != nil {
			t.Fatalf("kcat -C: %v\n%s", err, out)
		}
		var rec struct {
			Key     string   `json:"key"`
			Payload string   `json:"payload"`
			Headers []string `json:"headers"`
		}
		if err := json.Unmarshal(bytes.TrimSpace(out), &rec); err != nil {
			t.Fatalf("kcat printed %q: %v", out, err)
		}
		headers := map[string]string{}
		for i := 0; i+1 < len(rec.Headers); i += 2 {
			headers[rec.Headers[i]] = rec.Headers[i+1]
		}
		want := map[string]string{"ce_id": uuid, "ce_type": "OrderPlaced", "ce_specversion": "1.0",
			"ce_source": backends.DefaultCloudEventsSource, "ce_partitionkey": "o-7", "content-type": "application/json",
			outboxkit.MetadataPartitionKey: "o-7"}
		for k, v := range want {
			if headers[k] != v {
				t.Errorf("header %s = %q, want %q", k, headers[k], v)
			}
		}
		if headers["ce_time"] == "" {
			t.Error("no ce_time header")
		}
		if rec.Key != "o-7" || rec.Payload != `{"order_id":"o-7"}` {
			t.Errorf("record key %q payload %q", rec.Key, rec.Payload)
		}
	})
}
