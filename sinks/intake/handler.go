package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/backstop-sync/backstop"
)

// Handler serves POST {intake.path}: verify, parse, commit, answer.
type Handler struct {
	verifier Verifier
	writer   *Batcher
	metrics  *Metrics
	logger   *slog.Logger
	now      func() time.Time
	notify   func(backstop.Event) // told about accepted truncated events
	// bodyTimeout is how long a request's body may take to arrive.
	bodyTimeout time.Duration
	draining    atomic.Bool
	sigWarns    warnLimiter
	// storeWarns limits the lines logged for events the store refused:
	// while it fails, every request would otherwise write one.
	storeWarns warnLimiter
}

// sigWarnEvery is how often, at most, a refused signature, a wrong proxy
// token or an event the store refused is logged: anyone can send requests
// that fail, and each would otherwise write a line. The next line logged
// says how many were not; every refused signature is counted in
// backstop_intake_signature_failures_total.
const sigWarnEvery = time.Second

// warnLimiter lets one warning through per sigWarnEvery and counts the
// others. The zero value is ready to use.
type warnLimiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether a warning at now may be logged and, when it may,
// how many were held back since the last one logged.
func (l *warnLimiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < sigWarnEvery && now.Sub(l.last) >= 0 {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return true, n
}

// DefaultBodyTimeout is how long a webhook's body may take to arrive after
// its headers, unless HandlerOptions.BodyTimeout says otherwise: 64 KiB in
// 10 s is 6.5 KB/s, far slower than any platform sends.
const DefaultBodyTimeout = 10 * time.Second

// answerTimeout is how long the 408 answer to a body that did not arrive
// in time may take to write.
const answerTimeout = 5 * time.Second

// HandlerOptions configure a Handler.
type HandlerOptions struct {
	Metrics *Metrics
	Logger  *slog.Logger
	Now     func() time.Time
	// OnTruncated, when set, is called after a truncated event is committed
	// (to wake the fetcher).
	OnTruncated func(backstop.Event)
	// BodyTimeout is how long the body may take to arrive once the handler
	// has the request's headers, default DefaultBodyTimeout. A body that
	// is not complete in time (a stalled or trickling sender) is answered
	// 408 body_timeout and nothing is stored. It holds whatever the
	// server's ReadTimeout and WriteTimeout: the handler moves the
	// connection's read deadline to it, and gives the 408 its own time to
	// be written, so the sender gets an answer rather than a closed
	// connection.
	BodyTimeout time.Duration
}

// NewHandler returns the webhook endpoint.
func NewHandler(v Verifier, w *Batcher, opts HandlerOptions) *Handler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.BodyTimeout <= 0 {
		opts.BodyTimeout = DefaultBodyTimeout
	}
	return &Handler{verifier: v, writer: w, metrics: opts.Metrics, logger: opts.Logger, now: opts.Now, notify: opts.OnTruncated,
		bodyTimeout: opts.BodyTimeout}
}

// Drain makes the handler answer 503 to every new request; requests already
// past that check finish normally. Every answer given while draining
// closes its connection (Connection: close), so that the server's open
// connections end with their last request.
func (h *Handler) Drain() { h.draining.Store(true) }

// Draining reports whether Drain was called.
func (h *Handler) Draining() bool { return h.draining.Load() }

// refusal is one way a request is refused: the one table from errors to
// HTTP answers.
type refusal struct {
	status  int
	outcome string // metrics label
	code    string // JSON error code
}

var (
	refuseMethod    = refusal{http.StatusMethodNotAllowed, "method_not_allowed", "method_not_allowed"}
	refuseDraining  = refusal{http.StatusServiceUnavailable, "draining", "draining"}
	refuseMediaType = refusal{http.StatusUnsupportedMediaType, "unsupported_media_type", "unsupported_media_type"}
	refuseTooLarge  = refusal{http.StatusRequestEntityTooLarge, "too_large", "payload_too_large"}
	refuseTimeout   = refusal{http.StatusRequestTimeout, "timeout", "body_timeout"}
	refuseBadBody   = refusal{http.StatusBadRequest, "malformed", "bad_body"}
	refuseSignature = refusal{http.StatusUnauthorized, "bad_signature", "invalid_signature"}
	refuseMalformed = refusal{http.StatusBadRequest, "malformed", "malformed_event"}
	refuseStore     = refusal{http.StatusServiceUnavailable, "store_error", "store_unavailable"}
)

// ServeHTTP implements http.Handler. Nothing is stored for a refused request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		closeUnread(w, r)
		h.refuse(w, refuseMethod, "use POST to deliver webhooks")
		return
	}
	if h.draining.Load() {
		w.Header().Set("Retry-After", "5")
		h.refuse(w, refuseDraining, "the server is shutting down; retry shortly")
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" && !isJSONMediaType(ct) {
		closeUnread(w, r)
		h.refuse(w, refuseMediaType, fmt.Sprintf("Content-Type must be application/json (or application/…+json), got %q", r.Header.Get("Content-Type")))
		return
	}
	if r.ContentLength > MaxBody {
		closeUnread(w, r)
		h.refuse(w, refuseTooLarge, fmt.Sprintf("body of %d bytes is over the %d-byte limit", r.ContentLength, MaxBody))
		return
	}
	body, err := h.readBody(w, r)
	if err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			h.refuse(w, refuseTooLarge, fmt.Sprintf("body is over the %d-byte limit", MaxBody))
		case errors.Is(err, os.ErrDeadlineExceeded):
			answerLate(w)
			h.refuse(w, refuseTimeout, fmt.Sprintf("the request body was not received within %s", h.bodyTimeout))
		default:
			h.refuse(w, refuseBadBody, "the request body could not be read: "+err.Error())
		}
		return
	}
	if err := h.verifier.Verify(r.Header, body, h.now()); err != nil {
		if h.metrics != nil {
			h.metrics.SignatureFailures.Inc()
		}
		if ok, held := h.sigWarns.allow(h.now()); ok {
			h.logger.Warn("webhook refused: bad signature", "remote", r.RemoteAddr, "event_id", r.Header.Get("X-Event-Id"), "error", err,
				"not_logged_since_last", held)
		}
		h.refuse(w, refuseSignature, err.Error())
		return
	}
	ev, err := ParseEnvelope(body)
	if err != nil {
		h.refuse(w, refuseMalformed, err.Error())
		return
	}
	res, err := h.writer.Submit(r.Context(), ev)
	if err != nil {
		if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
			// The sender went away before the commit: there is no one to
			// answer. The event may still commit; its retry is then a
			// duplicate.
			h.count(outcomeSenderGone)
			return
		}
		if ok, held := h.storeWarns.allow(h.now()); ok {
			h.logger.Error("webhook not committed", "event_id", ev.ID, "error", err, "not_logged_since_last", held)
		}
		w.Header().Set("Retry-After", "5")
		h.refuse(w, refuseStore, "the event could not be stored; retry later")
		return
	}
	if res.Status == backstop.EmitDuplicate && h.metrics != nil {
		h.metrics.Duplicates.Inc()
	}
	if res.Status == backstop.EmitAccepted && ev.Truncated && h.notify != nil {
		h.notify(ev)
	}
	h.count(string(res.Status))
	h.closeIfDraining(w)
	writeStatus(w, res.Status)
}

// closeUnread makes an answer given before the body of r is read the last
// one on its connection. Otherwise net/http reads what is left of the body
// (up to 256 KiB) before it sends the answer: a sender whose body was slow
// or cut short got no answer at all until the read timeout (30 s).
func closeUnread(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
}

// closeIfDraining makes an answer given while draining the last one on its
// connection.
func (h *Handler) closeIfDraining(w http.ResponseWriter) {
	if h.draining.Load() {
		w.Header().Set("Connection", "close")
	}
}

// isJSONMediaType reports whether ct is application/json or a JSON type
// by its +json suffix (RFC 6839, application/cloudevents+json),
// parameters allowed.
func isJSONMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	sub, ok := strings.CutPrefix(mt, "application/")
	return ok && (sub == "json" || (len(sub) > len("+json") && strings.HasSuffix(sub, "+json")))
}

// readBody reads the body of r, at most MaxBody bytes, within
// h.bodyTimeout. Once it is read the deadline is lifted, so that a slow
// commit does not end the connection under the answer (net/http watches a
// connection whose body is read, and cancels the request when that read
// fails).
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return readBodyWithin(w, r, h.bodyTimeout)
}

// readBodyWithin reads the body of r, at most MaxBody bytes, within
// timeout, and lifts the deadline once it is read. A body that does not
// arrive in time fails with an error wrapping os.ErrDeadlineExceeded: call
// answerLate before answering it.
func readBodyWithin(w http.ResponseWriter, r *http.Request, timeout time.Duration) ([]byte, error) {
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(timeout)) == nil
	body, err := readAll(http.MaxBytesReader(w, r.Body, MaxBody), r.ContentLength)
	if err == nil && deadline {
		rc.SetReadDeadline(time.Time{})
	}
	return body, err
}

// answerLate prepares w for the answer to a request whose body did not
// arrive in time: the server's own deadlines may have passed with the read
// one, so the answer gets its own time, and the connection, its body
// unread, is closed after it.
func answerLate(w http.ResponseWriter) {
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(answerTimeout))
	w.Header().Set("Connection", "close")
}

// readAll is io.ReadAll that starts with room for the declared length, so
// that a body is read without growing its buffer.
func readAll(r io.Reader, contentLength int64) ([]byte, error) {
	size := int64(512)
	if contentLength > 0 && contentLength < MaxBody {
		size = contentLength + 1 // + 1: room to see EOF without growing
	}
	b := make([]byte, 0, size)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// statusBodies are the 200 answers, as writeJSON would encode them.
var statusBodies = map[backstop.EmitStatus][]byte{
	backstop.EmitAccepted:  []byte(`{"status":"` + string(backstop.EmitAccepted) + `"}` + "\n"),
	backstop.EmitDuplicate: []byte(`{"status":"` + string(backstop.EmitDuplicate) + `"}` + "\n"),
}

// writeStatus answers 200 {"status":…}.
func writeStatus(w http.ResponseWriter, status backstop.EmitStatus) {
	body, ok := statusBodies[status]
	if !ok {
		writeJSON(w, http.StatusOK, map[string]string{"status": string(status)})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

func (h *Handler) refuse(w http.ResponseWriter, why refusal, msg string) {
	h.count(why.outcome)
	h.closeIfDraining(w)
	WriteError(w, why.status, why.code, msg)
}

func (h *Handler) count(outcome string) {
	if h.metrics != nil {
		h.metrics.Requests.WithLabelValues(outcome).Inc()
	}
}

// WriteError writes the JSON error body every HTTP error of backstop uses:
// {"error":{"code":"…","message":"…"}}.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
