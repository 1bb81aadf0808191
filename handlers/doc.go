// Package handlers adapts typed functions to Watermill handlers and states the handler contract.
//
// A handler makes its effect through the transaction it is given (a typed handler receives it;
// outboxkit.TxFrom finds it otherwise): the inbox middleware began it, inserted the message's inbox
// row first, and commits both together after the handler returns nil. A handler never opens,
// commits or rolls back a transaction itself. An error rolls everything back: no effect, no inbox
// row, and the message is retried. Wrap an error with Permanent when retrying cannot help (a
// payload that does not decode, a reference that will never exist): the message is dead-lettered at
// once instead of being redelivered.
package handlers
