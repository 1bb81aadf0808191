package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
)

// kafkaTxnTimeout is how long the broker lets a transaction stay open before it aborts it, unless
// the URL's transaction_timeout says otherwise: Kafka's own default. A relay that dies with a
// transaction open holds read_committed consumers of its partitions back until then — or, as
// usually, until its successor starts and aborts it.
const kafkaTxnTimeout = time.Minute

// The broker's codes that say another producer initialised the transactional id since: this
// producer may never write again.
var kafkaFencedCodes = []*kerr.Error{kerr.ProducerFenced, kerr.InvalidProducerEpoch, kerr.TransactionalIDAuthorizationFailed}

// kafkaTxnProducer is the producer of a URL with a transactional_id: it publishes in Kafka
// transactions, and each transaction the forwarder commits carries the relay's progress, a record
// in the progress topic (one partition, compacted, keyed by the transactional id), so that the
// relay's record of what it published and what it published commit together — as Kafka Connect's
// exactly-once sources write their offsets. The forwarder drives it through Begin, Publish,
// Commit and Abort (forwarder.TransactionalPublisher); a Publish outside Begin is a transaction
// of its own.
//
// The transactional id names a relay group: the relays of one outbox, one of which publishes at a
// time. Recover initialises the id with the broker, which aborts what an earlier producer of the
// id left open and fences it: from then on the broker refuses that producer's writes and commits,
// which return errors marked outboxkit.Fenced.
type kafkaTxnProducer struct {
	conn      kafkaConn
	cl        atomic.Pointer[kgo.Client] // replaced by Recover, under mu
	marshaler kafkaMarshaler
	logger    watermill.LoggerAdapter

	// mu is held from Begin to Commit or Abort, and by a Publish outside a transaction for its own:
	// one transaction at a time.
	mu   sync.Mutex
	open atomic.Bool // a transaction begun by Begin is open
	// recovered: Recover ran once (under mu); the next one starts from a new client.
	recovered bool
	// gone is the broker's answer that fenced this producer: it sends nothing more, not even an
	// abort (on kfake an abort after the fence would take the successor's epoch).
	gone atomic.Pointer[error]

	closeOnce sync.Once
}

func newKafkaTxnProducer(conn kafkaConn, marshaler kafkaMarshaler, logger watermill.LoggerAdapter) (*kafkaTxnProducer, error) {
	quiet := newKgoLogger(logger, watermill.LogFields{"kafka_client": "producer", "transactional_id": conn.txn.id})
	quiet.infoAsDebug = true
	cl, err := kgo.NewClient(append(kafkaProducerOpts(conn, logger),
		kgo.TransactionalID(conn.txn.id),
		kgo.TransactionTimeout(conn.txn.timeout),
		kgo.WithLogger(quiet), // after kafkaProducerOpts' own: franz-go keeps the last
	)...)
	if err != nil {
		return nil, fmt.Errorf("kafka transactional publisher: %w", err)
	}
	p := &kafkaTxnProducer{conn: conn, marshaler: marshaler, logger: logger}
	p.cl.Store(cl)
	return p, nil
}

// fenced marks err as outboxkit.Fenced when the broker's answer says another producer took the
// transactional id.
func (p *kafkaTxnProducer) fenced(err error) error {
	if err == nil {
		return nil
	}
	for _, code := range kafkaFencedCodes {
		if errors.Is(err, code) {
			err = outboxkit.Fenced(fmt.Errorf("kafka: another relay initialised transactional_id %s since this one did; this one stops publishing: %w",
				p.conn.txn.id, err))
			p.gone.CompareAndSwap(nil, &err)
			return err
		}
	}
	return err
}

// Recover initialises the transactional id (fencing every earlier producer of it and aborting
// the transaction it left open, which the broker has done once this returns), then reads the
// progress the last committed transaction carried: nil when none did. It creates the progress
// topic when it is missing.
//
// Every Recover but the first starts from a new client: the forwarder recovers again after a
// commit whose outcome it does not know, or a mark that failed, and a franz-go client whose
// producer id failed keeps the error; a new one initialises the id afresh (aborting whatever this
// producer may still have open).
func (p *kafkaTxnProducer) Recover(ctx context.Context) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.ensureProgressTopic(ctx); err != nil {
		return nil, err
	}
	if p.recovered {
		if gone := p.gone.Load(); gone != nil {
			return nil, *gone
		}
		cl, err := kgo.NewClient(p.client().Opts()...)
		if err != nil {
			return nil, fmt.Errorf("kafka transactional publisher: %w", err)
		}
		p.cl.Swap(cl).Close()
	}
	p.recovered = true
	if _, _, err := p.client().ProducerID(ctx); err != nil {
		return nil, p.fenced(fmt.Errorf("kafka: initialise transactional_id %s: %w", p.conn.txn.id, err))
	}
	return p.lastProgress(ctx)
}

// ensureProgressTopic creates the progress topic, one compacted partition, unless it exists.
func (p *kafkaTxnProducer) ensureProgressTopic(ctx context.Context) error {
	cl, err := kgo.NewClient(p.conn.kgoOpts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	compact := "compact"
	res, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, p.conn.txn.progressTopic)
	if err == nil {
		err = res.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafka: create the progress topic %s: %w", p.conn.txn.progressTopic, err)
	}
	return nil
}

// lastProgress reads the progress topic's last committed record of the transactional id. It
// reads the tail with read_committed, keeping the commit and abort markers so that it knows when
// it has read up to the end it asked for (the marker of the last transaction is the last
// offset); windows further back are read while the tail holds aborted transactions only.
func (p *kafkaTxnProducer) lastProgress(ctx context.Context) ([]byte, error) {
	topic := p.conn.txn.progressTopic
	cl, err := kgo.NewClient(p.conn.kgoOpts()...)
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	cl.Close()
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: read the end of the progress topic %s: %w", topic, err)
	}
	end, ok := ends.Lookup(topic, 0)
	if !ok {
		return nil, fmt.Errorf("kafka: the progress topic %s has no partition 0", topic)
	}
	const window = 64
	for stop := end.Offset; stop > 0; {
		start := max(0, stop-window)
		rec, err := p.readProgress(ctx, start, stop)
		if err != nil || rec != nil {
			return rec, err
		}
		stop = start
	}
	return nil, nil
}

// readProgress reads offsets [start, stop) of the progress topic and returns the value of its
// last committed record of the transactional id, nil when there is none there.
func (p *kafkaTxnProducer) readProgress(ctx context.Context, start, stop int64) ([]byte, error) {
	topic := p.conn.txn.progressTopic
	cl, err := kgo.NewClient(append(p.conn.kgoOpts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(start)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var last []byte
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("kafka: read the progress topic %s up to offset %d: %w", topic, stop, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return nil, fmt.Errorf("kafka: read the progress topic %s: %w", topic, ferr)
		}
		reached := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= stop {
				reached = true
				return
			}
			if !r.Attrs.IsControl() && string(r.Key) == p.conn.txn.id {
				last = r.Value
			}
			if r.Offset == stop-1 {
				reached = true
			}
		})
		if reached {
			return last, nil
		}
	}
}

// Begin starts a transaction: what Publish sends until Commit or Abort belongs to it.
func (p *kafkaTxnProducer) Begin(ctx context.Context) error {
	p.mu.Lock()
	if gone := p.gone.Load(); gone != nil {
		p.mu.Unlock()
		return *gone
	}
	if err := p.client().BeginTransaction(); err != nil {
		p.mu.Unlock()
		return p.fenced(fmt.Errorf("kafka: begin a transaction: %w", err))
	}
	p.open.Store(true)
	return nil
}

// Publish sends msgs in the open transaction, or, when none is open, in one of their own that it
// commits. Visible to read_committed consumers once it commits.
func (p *kafkaTxnProducer) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, msg := range msgs {
		r, err := p.marshaler.marshalRecord(topic, msg)
		if err != nil {
			return fmt.Errorf("kafka publisher: message %s: %w", msg.UUID, err)
		}
		recs[i] = r
	}
	ctx := msgs[0].Context()
	if p.inTxn() {
		return p.produce(ctx, topic, recs)
	}
	if err := p.Begin(ctx); err != nil {
		return err
	}
	if err := p.produce(ctx, topic, recs); err != nil {
		defer p.end()
		return p.abortAfter(ctx, err)
	}
	return p.Commit(ctx, nil)
}

// inTxn reports whether Begin opened a transaction that is still open: a Publish then belongs to
// it (the forwarder publishes a transaction's rows between its Begin and its Commit).
func (p *kafkaTxnProducer) inTxn() bool {
	return p.open.Load()
}

func (p *kafkaTxnProducer) produce(ctx context.Context, topic string, recs []*kgo.Record) error {
	if err := p.client().ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return p.fenced(fmt.Errorf("kafka publisher: publish to %s: %w", topic, err))
	}
	return nil
}

// Commit writes progress (unless nil) to the progress topic in the transaction and commits it:
// the transaction's records become visible to read_committed consumers with it, or none does.
// On an error the transaction is aborted if it can be; whether a commit whose answer was lost
// took effect, only Recover can tell.
func (p *kafkaTxnProducer) Commit(ctx context.Context, progress []byte) error {
	defer p.end()
	if progress != nil {
		rec := &kgo.Record{Topic: p.conn.txn.progressTopic, Key: []byte(p.conn.txn.id), Value: progress}
		if err := p.client().ProduceSync(ctx, rec).FirstErr(); err != nil {
			return p.abortAfter(ctx, fmt.Errorf("kafka: write the relay's progress to %s: %w", p.conn.txn.progressTopic, err))
		}
	}
	if err := p.client().Flush(ctx); err != nil {
		return p.abortAfter(ctx, fmt.Errorf("kafka: flush the transaction: %w", err))
	}
	if err := p.client().EndTransaction(ctx, kgo.TryCommit); err != nil {
		return p.abortAfter(ctx, fmt.Errorf("kafka: commit the transaction: %w", err))
	}
	return nil
}

// abortAfter aborts the transaction after err, unless err says the producer is fenced: a fenced
// producer writes nothing more, not even an abort (the successor's initialisation aborted its
// transaction already).
func (p *kafkaTxnProducer) abortAfter(ctx context.Context, err error) error {
	if err = p.fenced(err); outboxkit.IsFenced(err) {
		return err
	}
	if aerr := p.abort(ctx); aerr != nil {
		return errors.Join(err, aerr)
	}
	return err
}

// Abort aborts the open transaction: none of its records becomes visible to read_committed
// consumers.
func (p *kafkaTxnProducer) Abort(ctx context.Context) error {
	defer p.end()
	return p.abort(ctx)
}

func (p *kafkaTxnProducer) abort(ctx context.Context) error {
	if gone := p.gone.Load(); gone != nil {
		return *gone
	}
	ctx = context.WithoutCancel(ctx)
	ctx, cancel := context.WithTimeout(ctx, kafkaFlushTimeout)
	defer cancel()
	if err := p.client().AbortBufferedRecords(ctx); err != nil {
		return fmt.Errorf("kafka: abort the transaction's buffered records: %w", err)
	}
	if err := p.client().EndTransaction(ctx, kgo.TryAbort); err != nil {
		return p.fenced(fmt.Errorf("kafka: abort the transaction: %w", err))
	}
	return nil
}

func (p *kafkaTxnProducer) client() *kgo.Client { return p.cl.Load() }

func (p *kafkaTxnProducer) end() {
	p.open.Store(false)
	p.mu.Unlock()
}

// Close aborts nothing it has not already ended and closes the client: a transaction still open
// is aborted by the broker (by the next producer of the id, or at transaction_timeout).
func (p *kafkaTxnProducer) Close() error {
	p.closeOnce.Do(func() { p.client().Close() })
	return nil
}

// kafkaTxnPublisher is the transactional producer behind the backend's bounded publisher: the
// forwarder finds Begin, Commit, Abort and Recover on it.
type kafkaTxnPublisher struct {
	*brokerio.BoundedPublisher
	txn *kafkaTxnProducer
}

func (p *kafkaTxnPublisher) Recover(ctx context.Context) ([]byte, error) {
	b, err := p.txn.Recover(ctx)
	return b, p.classify(err)
}

func (p *kafkaTxnPublisher) Begin(ctx context.Context) error { return p.classify(p.txn.Begin(ctx)) }

func (p *kafkaTxnPublisher) Commit(ctx context.Context, progress []byte) error {
	return p.classify(p.txn.Commit(ctx, progress))
}

func (p *kafkaTxnPublisher) Abort(ctx context.Context) error { return p.classify(p.txn.Abort(ctx)) }

// TransactionalID names the relay group whose transactions this publisher makes.
func (p *kafkaTxnPublisher) TransactionalID() string { return p.txn.conn.txn.id }

func (p *kafkaTxnPublisher) classify(err error) error {
	if err == nil || outboxkit.IsFenced(err) {
		return err
	}
	return classifyKafka(err)
}
