package middleware

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// AddConsumerHandler adds to r a handler that reads topic through sub and runs h behind the
// stack that cfg builds (see Stack): the one call that puts a handler, its stack and its
// subscription under one consumer name. It is Watermill's Router.AddConsumerHandler followed by
// Handler.AddMiddleware(stack...), with the checks that can be made before anything runs:
//
//   - cfg is valid (Stack's errors, naming the field);
//   - sub reads for cfg.Consumer. Every subscriber of package backends names the consumer it reads
//     for (its Consumer method): the broker's group, queue or durable consumer. The inbox records
//     each message under cfg.Consumer, so the two must be one name; a stack built for another
//     name would hold every message it is given (ErrWrongConsumer), so it is refused here, when
//     the program starts, instead. A subscriber that does not name its consumer (one of
//     Watermill's own) is taken as it is.
//
// The handler is named handlerName in the router, as with Watermill. On error nothing is added.
func AddConsumerHandler(r *message.Router, handlerName, topic string, sub message.Subscriber, cfg StackConfig,
	h message.NoPublishHandlerFunc) (*message.Handler, error) {
	if r == nil || sub == nil || h == nil {
		return nil, fmt.Errorf("add consumer handler %q: a router, a subscriber and a handler are required", handlerName)
	}
	if topic == "" {
		return nil, fmt.Errorf("add consumer handler %q: name the topic it reads", handlerName)
	}
	if err := checkSubscriber(sub, cfg.Consumer); err != nil {
		return nil, fmt.Errorf("add consumer handler %q: %w", handlerName, err)
	}
	stack, err := Stack(cfg)
	if err != nil {
		return nil, fmt.Errorf("add consumer handler %q: %w", handlerName, err)
	}
	handler := r.AddConsumerHandler(handlerName, topic, sub, h)
	handler.AddMiddleware(stack...)
	return handler, nil
}

// checkSubscriber refuses a subscriber that names another consumer than consumer.
func checkSubscriber(sub message.Subscriber, consumer string) error {
	named, ok := sub.(interface{ Consumer() string })
	if !ok || named.Consumer() == consumer {
		return nil
	}
	if consumer == "" {
		return errors.New("field Consumer is required: name the consuming service, the same name its subscriber reads for")
	}
	return fmt.Errorf("%w: the subscriber reads for consumer %q and StackConfig.Consumer is %q; "+
		"both name one consumer (its broker group or queue, and its inbox rows), so give them the same name: "+
		"subscribe with NewSubscriber(%q), or set StackConfig.Consumer to %q if that is the name its inbox rows carry",
		ErrWrongConsumer, named.Consumer(), consumer, consumer, named.Consumer())
}
