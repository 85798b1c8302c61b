package intake

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/jsonvalid"
)

// Enqueuer queues a payload for a delivery target (the outbox).
type Enqueuer interface {
	// Enqueue queues payload for target under the caller's key, once per
	// (target, key) while the row is kept, and returns the row's id (the
	// first one's for a repeat). Keys never meet the ids of events: an
	// event and a payload with the same id are two deliveries. See
	// store.DB.Enqueue.
	Enqueue(ctx context.Context, target, key, eventType string, payload json.RawMessage, now time.Time) (int64, error)
}

// Proxy serves POST /outbox/{target}: webhook-proxy mode. Internal services
// send any JSON body with a bearer token and get 202 once it is durable in
// the target's queue; backstop owns the retries from there.
type Proxy struct {
	queue Enqueuer
	// tokenSums are the SHA-256s of the tokens taken: presented tokens
	// are compared over their hashes, in constant time, so that neither
	// a token's bytes nor its length leak. None turns the proxy off.
	tokenSums [][sha256.Size]byte
	// failed counts wrong tokens per client address.
	failed AuthFailures
	// tokenWarns limits the lines logged for wrong tokens.
	tokenWarns warnLimiter
	targets    map[string]bool
	limits     map[string]int // ProxyOptions.MaxPayload
	logger     *slog.Logger
	now        func() time.Time
	wake       func(target string)
	// bodyTimeout is how long a body may take to arrive (BodyTimeout).
	bodyTimeout time.Duration
}

// ProxyOptions configure a Proxy.
type ProxyOptions struct {
	// Token is the bearer token callers must send, and Tokens more that
	// are taken as well (to rotate the token without downtime: add the new
	// one, move the callers, drop the old); with none, the proxy is off
	// (every request is answered 404). Empty ones are left out.
	Token   string
	Tokens  []string
	Targets []string
	// MaxPayload is the most bytes of body a target takes (its
	// max_payload), by name; a body over it is refused 413, as the
	// target would be sent the body as it came. A target left out
	// takes up to MaxBody.
	MaxPayload map[string]int
	Logger     *slog.Logger
	Now        func() time.Time
	// OnQueued, when set, is told the target of every queued payload (to
	// wake its delivery worker).
	OnQueued func(target string)
	// BodyTimeout is how long the body may take to arrive once the proxy
	// has the request's headers, default DefaultBodyTimeout; a body that
	// does not is answered 408 body_timeout and nothing is queued.
	BodyTimeout time.Duration
}

// overTargetLimit answers 413 for a body of n bytes over target's
// max_payload of limit bytes.
func (p *Proxy) overTargetLimit(w http.ResponseWriter, target string, n int64, limit int) {
	WriteError(w, http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf(
		"body of %d bytes is over target %s's max_payload of %d bytes: a proxied body is delivered as it came, so nothing was queued", n, target, limit))
}

// NewProxy returns the webhook-proxy endpoint over queue.
func NewProxy(queue Enqueuer, opts ProxyOptions) *Proxy {
	p := &Proxy{queue: queue, targets: map[string]bool{}, limits: opts.MaxPayload,
		logger: opts.Logger, now: opts.Now, wake: opts.OnQueued, bodyTimeout: opts.BodyTimeout}
	for _, tok := range append([]string{opts.Token}, opts.Tokens...) {
		if tok != "" {
			p.tokenSums = append(p.tokenSums, sha256.Sum256([]byte(tok)))
		}
	}
	if p.bodyTimeout <= 0 {
		p.bodyTimeout = DefaultBodyTimeout
	}
	for _, t := range opts.Targets {
		p.targets[t] = true
	}
	if p.logger == nil {
		p.logger = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p
}

// ServeHTTP handles POST /outbox/{target}. The body must be JSON in UTF-8.
// The caller's key is its X-Event-Id (or Idempotency-Key), so a retried
// call is queued once; without one a new key is made. The key and
// X-Event-Type follow the intake's rule for ids (CheckID). The key is what
// the target is sent as X-Event-Id and webhook-id, and what the 202 answer
// reports as event_id. An address that sent MaxAuthFailures wrong tokens
// within AuthFailureWindow is answered 429, with Retry-After, until the
// window ends, whatever token it sends meanwhile.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every answer before the body is read ends the connection (closeUnread).
	if len(p.tokenSums) == 0 {
		closeUnread(w, r)
		WriteError(w, http.StatusNotFound, "proxy_off", "webhook-proxy mode is off: set intake.proxy_token to turn it on")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		closeUnread(w, r)
		WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST to queue a payload")
		return
	}
	addr := ClientAddr(r)
	if wait := p.failed.Blocked(addr, p.now()); wait > 0 {
		closeUnread(w, r)
		secs := strconv.Itoa(int((wait + time.Second - 1) / time.Second))
		w.Header().Set("Retry-After", secs)
		WriteError(w, http.StatusTooManyRequests, "too_many_failures",
			"too many wrong bearer tokens from this address; try again in "+secs+" s")
		return
	}
	if !p.tokenOK(r.Header.Get("Authorization")) {
		now := p.now()
		if ok, held := p.tokenWarns.allow(now); ok {
			p.logger.Warn("proxy: missing or wrong bearer token", "remote", r.RemoteAddr, "not_logged_since_last", held)
		}
		p.failed.Fail(addr, now)
		closeUnread(w, r)
		WriteError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token")
		return
	}
	target := r.PathValue("target")
	if !p.targets[target] {
		closeUnread(w, r)
		WriteError(w, http.StatusNotFound, "unknown_target", fmt.Sprintf("no target named %q", target))
		return
	}
	if r.ContentLength > MaxBody {
		closeUnread(w, r)
		WriteError(w, http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("body of %d bytes is over the %d-byte limit", r.ContentLength, MaxBody))
		return
	}
	if limit := p.limits[target]; limit > 0 && r.ContentLength > int64(limit) {
		closeUnread(w, r)
		p.overTargetLimit(w, target, r.ContentLength, limit)
		return
	}
	body, err := readBodyWithin(w, r, p.bodyTimeout)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			WriteError(w, http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("body is over the %d-byte limit", MaxBody))
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			answerLate(w)
			WriteError(w, http.StatusRequestTimeout, "body_timeout", fmt.Sprintf("the request body was not received within %s", p.bodyTimeout))
			return
		}
		WriteError(w, http.StatusBadRequest, "bad_body", "the request body could not be read: "+err.Error())
		return
	}
	if limit := p.limits[target]; limit > 0 && len(body) > limit {
		p.overTargetLimit(w, target, int64(len(body)), limit)
		return
	}
	if i := invalidUTF8(body); i >= 0 {
		WriteError(w, http.StatusBadRequest, "malformed_json",
			fmt.Sprintf("the body must be JSON in UTF-8: byte %d (0x%02x) is not valid UTF-8", i, body[i]))
		return
	}
	if !jsonvalid.Valid(body) {
		WriteError(w, http.StatusBadRequest, "malformed_json", "the body must be JSON")
		return
	}
	eventID, header := r.Header.Get("X-Event-Id"), "X-Event-Id"
	if eventID == "" {
		eventID, header = r.Header.Get("Idempotency-Key"), "Idempotency-Key"
	}
	if eventID == "" {
		b := make([]byte, 12)
		rand.Read(b)
		eventID = "evt_px_" + hex.EncodeToString(b)
	} else if err := CheckID(eventID); err != nil {
		WriteError(w, http.StatusBadRequest, "bad_event_id", fmt.Sprintf("%s %v", header, err))
		return
	}
	eventType := r.Header.Get("X-Event-Type")
	if eventType == "" {
		eventType = "proxy"
	} else if err := CheckID(eventType); err != nil {
		WriteError(w, http.StatusBadRequest, "bad_event_type", fmt.Sprintf("X-Event-Type %v", err))
		return
	}
	id, err := p.queue.Enqueue(r.Context(), target, eventID, eventType, body, p.now())
	if reused := (*backstop.KeyReusedError)(nil); errors.As(err, &reused) {
		WriteError(w, http.StatusConflict, "key_reused", fmt.Sprintf(
			"%s %q was already queued for %s (delivery %d) with another payload or event type, and that first one is what is delivered: "+
				"a repeat must carry the same body; give a new payload a new key", header, eventID, target, reused.ID))
		return
	}
	if err != nil {
		p.logger.Error("proxy payload not queued", "target", target, "error", err)
		w.Header().Set("Retry-After", "5")
		WriteError(w, http.StatusServiceUnavailable, "store_unavailable", "the payload could not be stored; retry later")
		return
	}
	if p.wake != nil {
		p.wake(target)
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"status": "queued", "id": id, "event_id": eventID})
}

// tokenOK reports whether an Authorization header value carries one of the
// proxy's bearer tokens, comparing SHA-256 hashes in constant time.
func (p *Proxy) tokenOK(authorization string) bool {
	// The scheme's name is case-insensitive (RFC 9110, 11.1).
	scheme, tok, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	ok = false
	for _, want := range p.tokenSums { // every one, whichever matches
		ok = subtle.ConstantTimeCompare(sum[:], want[:]) == 1 || ok
	}
	return ok
}

// invalidUTF8 returns the offset of the first byte of b that does not
// start a valid UTF-8 sequence, or -1 when b is valid UTF-8.
func invalidUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}
