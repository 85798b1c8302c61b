// Package delivery sends queued events to downstream HTTP targets: one
// worker per target over its due outbox rows, a finite retry schedule with
// jitter, 429 Retry-After pauses, dead-letter, a log of every attempt, and
// an SSRF guard checked when each connection is dialled.
//
// The package reaches the durable queue only through the Queue interface;
// cmd adapts the store to it.
package delivery
