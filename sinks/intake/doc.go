// Package intake receives the platform's webhooks: it verifies their
// signatures over the raw body, parses the envelope, and hands each event to
// the emit path through a group-commit writer, answering 2xx only after the
// commit that holds the event. A refused request gets a JSON error and
// stores nothing; a body that does not arrive within the handler's body
// timeout is answered 408, whatever the server's own timeouts. It also
// completes truncated events by fetching their objects from the API.
package intake
