package intake

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/keyedmac"
)

// ErrSignature is wrapped by every error a Verifier returns: the request's
// signature is missing, malformed, expired or does not match.
var ErrSignature = errors.New("intake: bad or missing signature")

// The signature schemes NewVerifier accepts (the intake.scheme setting).
const (
	// SchemeBotix is the platform's own: X-Botix-Signature, the hex
	// HMAC-SHA256 of the raw body.
	SchemeBotix = "botix"
	// SchemeStandardWebhooks is https://www.standardwebhooks.com:
	// webhook-id, webhook-timestamp and webhook-signature.
	SchemeStandardWebhooks = "standard-webhooks"
	// SchemeGitHub is GitHub's X-Hub-Signature-256.
	SchemeGitHub = "github"
	// SchemeStripe is Stripe's Stripe-Signature.
	SchemeStripe = "stripe"
)

// Schemes lists the scheme names NewVerifier accepts.
var Schemes = []string{SchemeBotix, SchemeStandardWebhooks, SchemeGitHub, SchemeStripe}

// DefaultTolerance is how far a timestamped scheme's timestamp may be from
// now, in either direction, when SchemeOptions.Tolerance is zero.
const DefaultTolerance = 5 * time.Minute

// The headers the schemes read.
const (
	HeaderBotixSignature   = "X-Botix-Signature"
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
	HeaderGitHubSignature  = "X-Hub-Signature-256"
	HeaderStripeSignature  = "Stripe-Signature"
)

const (
	standardSignatureV1   = "v1"
	githubSignaturePrefix = "sha256="
	botixOptionalPrefix   = "sha256="
	stripeTimestampKey    = "t"
	stripeSignatureV1     = "v1"
	hmacSHA256Size        = sha256.Size
	hmacSHA256HexSize     = 2 * sha256.Size
	// maxUnixTimestampDigits keeps time.Unix and time arithmetic far from
	// overflow.
	maxUnixTimestampDigits = 18
	// maxSignaturesPerHeader bounds the work one request can cause.
	maxSignaturesPerHeader  = 64
	maxSignatureHeaderBytes = 8 << 10
	// maxWebhookIDBytes takes the webhook-id backstop's own delivery
	// sends for the longest id it takes: MaxIDBytes bytes, every one
	// percent-encoded (delivery.HeaderForm).
	maxWebhookIDBytes = 3 * MaxIDBytes
)

// Verifier checks a webhook request's signature over the raw body bytes.
// Implementations are safe for concurrent use.
type Verifier interface {
	// Verify returns nil when the signature is valid, else an error
	// wrapping ErrSignature whose message says what is wrong and never
	// contains a secret or the expected signature. now is the time
	// timestamped schemes measure their tolerance against.
	Verify(h http.Header, body []byte, now time.Time) error
}

// SchemeOptions configures a Verifier.
type SchemeOptions struct {
	// Secrets are the accepted secrets; a request signed with any of them
	// passes, so that a secret can be rotated without downtime. At least
	// one is required, and none may be empty.
	Secrets []string
	// Tolerance is how far the timestamp of a timestamped scheme
	// (standard-webhooks, stripe) may be from now, too old or too new.
	// Zero means DefaultTolerance; negative is an error.
	Tolerance time.Duration
}

// NewVerifier returns the Verifier for scheme (one of Schemes). It returns
// an error for an unknown scheme, no secret, an empty secret, a
// standard-webhooks secret that is not base64, or a negative tolerance.
// Errors name the secret by its position, never by its value.
func NewVerifier(scheme string, opts SchemeOptions) (Verifier, error) {
	if len(opts.Secrets) == 0 {
		return nil, fmt.Errorf("intake: scheme %q: no secret configured", scheme)
	}
	for i, s := range opts.Secrets {
		if s == "" {
			return nil, fmt.Errorf("intake: scheme %q: secret %d of %d is empty", scheme, i+1, len(opts.Secrets))
		}
	}
	if opts.Tolerance < 0 {
		return nil, fmt.Errorf("intake: scheme %q: tolerance %v is negative", scheme, opts.Tolerance)
	}
	tol := opts.Tolerance
	if tol == 0 {
		tol = DefaultTolerance
	}
	switch scheme {
	case SchemeBotix:
		return &hexBodyVerifier{keys: macKeys(rawKeys(opts.Secrets)), header: HeaderBotixSignature, parse: parseBotixHeader}, nil
	case SchemeGitHub:
		return &hexBodyVerifier{keys: macKeys(rawKeys(opts.Secrets)), header: HeaderGitHubSignature, parse: parseGitHubHeader}, nil
	case SchemeStripe:
		return &stripeVerifier{keys: macKeys(rawKeys(opts.Secrets)), tolerance: tol}, nil
	case SchemeStandardWebhooks:
		keys := make([][]byte, len(opts.Secrets))
		for i, s := range opts.Secrets {
			k, err := backstop.DecodeWebhookSecret(s)
			if err != nil {
				return nil, fmt.Errorf("intake: scheme %q: secret %d of %d: %w", scheme, i+1, len(opts.Secrets), err)
			}
			keys[i] = k
		}
		return &standardVerifier{keys: macKeys(keys), tolerance: tol}, nil
	}
	return nil, fmt.Errorf("intake: unknown signature scheme %q (want one of %s)", scheme, strings.Join(Schemes, ", "))
}

// rawKeys uses each secret's bytes verbatim as an HMAC key.
func rawKeys(secrets []string) [][]byte {
	keys := make([][]byte, len(secrets))
	for i, s := range secrets {
		keys[i] = []byte(s)
	}
	return keys
}

// hmacSHA256 returns HMAC-SHA256(key, parts...).
func hmacSHA256(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// macKeys keys an HMAC-SHA256 with each of keys, once.
func macKeys(keys [][]byte) []*keyedmac.Key {
	out := make([]*keyedmac.Key, len(keys))
	for i, k := range keys {
		out[i] = keyedmac.New(k)
	}
	return out
}

// anyMatch reports whether any of the signatures equals the MAC computed
// with any of the keys. Every key and every signature is compared in
// constant time; the loop does not stop early on a match so that timing
// does not tell which secret of the rotation is in use.
func anyMatch(keys []*keyedmac.Key, sigs [][]byte, mac func(key *keyedmac.Key) []byte) bool {
	ok := 0
	for _, k := range keys {
		want := mac(k)
		for _, s := range sigs {
			if hmac.Equal(want, s) {
				ok = 1
			}
		}
	}
	return ok == 1
}

// sigErr wraps ErrSignature with a reason a person understands.
func sigErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrSignature}, args...)...)
}

// checkTimestamp enforces the tolerance window around now, in both
// directions.
func checkTimestamp(header string, ts, now time.Time, tol time.Duration) error {
	if age := now.Sub(ts); age > tol {
		return sigErr("%s is too old: %v before now, more than the %v tolerance (replayed or delayed request?)", header, age.Truncate(time.Second), tol)
	}
	if ts.Year() > now.Year()+100 {
		// The difference would read as time.Duration's cap, 2562047h.
		return sigErr("%s is in the year %d: it must be a Unix time in seconds (milliseconds sent?)", header, ts.Year())
	}
	if ahead := ts.Sub(now); ahead > tol {
		return sigErr("%s is too new: %v after now, more than the %v tolerance (is the sender's clock right?)", header, ahead.Truncate(time.Second), tol)
	}
	return nil
}

// parseUnix parses a decimal Unix time in seconds: ASCII digits only, no
// sign, at most maxUnixTimestampDigits digits.
func parseUnix(s string) (time.Time, bool) {
	if s == "" || len(s) > maxUnixTimestampDigits {
		return time.Time{}, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return time.Time{}, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// --- botix and github: a hex HMAC-SHA256 of the body, no timestamp ---

// hexBodyVerifier verifies schemes whose header carries one hex
// HMAC-SHA256 of the raw body (botix, github).
type hexBodyVerifier struct {
	keys   []*keyedmac.Key
	header string
	parse  func(string) ([]byte, error)
}

// Verify implements Verifier.
func (v *hexBodyVerifier) Verify(h http.Header, body []byte, _ time.Time) error {
	value := h.Get(v.header)
	if value == "" {
		return sigErr("the %s header is missing", v.header)
	}
	sig, err := v.parse(value)
	if err != nil {
		return sigErr("%s: %v", v.header, err)
	}
	if !anyMatch(v.keys, [][]byte{sig}, func(k *keyedmac.Key) []byte { return k.Sum(nil, body) }) {
		return sigErr("%s does not match the body (wrong secret, or the body was changed)", v.header)
	}
	return nil
}

// decodeHexMAC decodes a hex HMAC-SHA256 in either case.
func decodeHexMAC(s string) ([]byte, error) {
	if len(s) != hmacSHA256HexSize {
		return nil, fmt.Errorf("want %d hex digits, got %d characters", hmacSHA256HexSize, len(s))
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, errors.New("not hexadecimal")
	}
	return b, nil
}

// parseBotixHeader decodes X-Botix-Signature: a hex HMAC-SHA256 in either
// case, with an optional "sha256=" prefix and surrounding spaces.
func parseBotixHeader(value string) ([]byte, error) {
	s := strings.TrimSpace(value)
	if len(s) >= len(botixOptionalPrefix) && strings.EqualFold(s[:len(botixOptionalPrefix)], botixOptionalPrefix) {
		s = s[len(botixOptionalPrefix):]
	}
	return decodeHexMAC(s)
}

// parseGitHubHeader decodes X-Hub-Signature-256: "sha256=" followed by a
// hex HMAC-SHA256.
func parseGitHubHeader(value string) ([]byte, error) {
	s := strings.TrimSpace(value)
	if !strings.HasPrefix(s, githubSignaturePrefix) {
		return nil, errors.New(`want "sha256=<hex>"`)
	}
	return decodeHexMAC(s[len(githubSignaturePrefix):])
}

// SignBotix returns the X-Botix-Signature value for body: the lowercase hex
// HMAC-SHA256 of the raw body keyed with secret.
func SignBotix(secret string, body []byte) string {
	return hex.EncodeToString(hmacSHA256([]byte(secret), body))
}

// SignGitHub returns the X-Hub-Signature-256 value for body:
// "sha256=" and the lowercase hex HMAC-SHA256 keyed with secret.
func SignGitHub(secret string, body []byte) string {
	return githubSignaturePrefix + hex.EncodeToString(hmacSHA256([]byte(secret), body))
}

// --- standard webhooks ---

// standardVerifier verifies Standard Webhooks signatures.
type standardVerifier struct {
	keys      []*keyedmac.Key
	tolerance time.Duration
}

// parseStandardSignatures decodes a webhook-signature header: signatures
// separated by spaces, each "<version>,<base64>". Only v1 signatures are
// returned; other versions, and v1 entries that are not base64, are
// ignored. The error says why no v1 signature could be read.
func parseStandardSignatures(value string) ([][]byte, error) {
	if len(value) > maxSignatureHeaderBytes {
		return nil, fmt.Errorf("header is %d bytes, more than %d", len(value), maxSignatureHeaderBytes)
	}
	var sigs [][]byte
	fields := strings.Fields(value)
	if len(fields) == 0 {
		return nil, errors.New("no signature in header")
	}
	for _, f := range fields {
		version, b64, ok := strings.Cut(f, ",")
		if !ok || version != standardSignatureV1 {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(sig) != hmacSHA256Size {
			continue
		}
		if len(sigs) == maxSignaturesPerHeader {
			break
		}
		sigs = append(sigs, sig)
	}
	if len(sigs) == 0 {
		return nil, errors.New(`no readable "v1,<base64>" signature`)
	}
	return sigs, nil
}

// Verify implements Verifier.
func (v *standardVerifier) Verify(h http.Header, body []byte, now time.Time) error {
	id := h.Get(HeaderWebhookID)
	if id == "" {
		return sigErr("the %s header is missing", HeaderWebhookID)
	}
	if len(id) > maxWebhookIDBytes {
		return sigErr("the %s header is longer than %d bytes", HeaderWebhookID, maxWebhookIDBytes)
	}
	tsValue := h.Get(HeaderWebhookTimestamp)
	if tsValue == "" {
		return sigErr("the %s header is missing", HeaderWebhookTimestamp)
	}
	ts, ok := parseUnix(tsValue)
	if !ok {
		return sigErr("%s is not a Unix time in seconds", HeaderWebhookTimestamp)
	}
	sigValue := strings.Join(h.Values(HeaderWebhookSignature), " ")
	if strings.TrimSpace(sigValue) == "" {
		return sigErr("the %s header is missing", HeaderWebhookSignature)
	}
	sigs, err := parseStandardSignatures(sigValue)
	if err != nil {
		return sigErr("%s: %v", HeaderWebhookSignature, err)
	}
	if err := checkTimestamp(HeaderWebhookTimestamp, ts, now, v.tolerance); err != nil {
		return err
	}
	prefix := []byte(id + "." + tsValue + ".")
	if !anyMatch(v.keys, sigs, func(k *keyedmac.Key) []byte { return k.Sum(nil, prefix, body) }) {
		return sigErr("no %s signature matches the body (wrong secret, or the body, id or timestamp was changed)", HeaderWebhookSignature)
	}
	return nil
}

// SignStandardWebhooks returns the webhook-signature value ("v1,<base64>")
// for a message id, timestamp and body. secret is "whsec_" and base64, or
// the base64 alone; the error says when it is neither.
func SignStandardWebhooks(secret, id string, ts time.Time, body []byte) (string, error) {
	key, err := backstop.DecodeWebhookSecret(secret)
	if err != nil {
		return "", fmt.Errorf("intake: sign: %w", err)
	}
	prefix := []byte(id + "." + strconv.FormatInt(ts.Unix(), 10) + ".")
	return standardSignatureV1 + "," + base64.StdEncoding.EncodeToString(hmacSHA256(key, prefix, body)), nil
}

// --- stripe ---

// stripeVerifier verifies Stripe-Signature headers. The HMAC key is the
// whole secret string, "whsec_" included.
type stripeVerifier struct {
	keys      []*keyedmac.Key
	tolerance time.Duration
}

// stripeHeader is a parsed Stripe-Signature header.
type stripeHeader struct {
	// timestamp is the t= value as sent: it is part of the signed payload.
	timestamp string
	t         time.Time
	// v1 holds the decoded v1 signatures; other schemes are ignored.
	v1 [][]byte
}

// parseStripeHeader decodes "t=<unix>,v1=<hex>[,v1=<hex>][,v0=<hex>]…".
// Exactly one t is required. Other keys, and v1 values that are not a hex
// HMAC-SHA256, are ignored, as Stripe's own libraries do; at least one
// readable v1 is required.
func parseStripeHeader(value string) (stripeHeader, error) {
	var out stripeHeader
	if len(value) > maxSignatureHeaderBytes {
		return out, fmt.Errorf("header is %d bytes, more than %d", len(value), maxSignatureHeaderBytes)
	}
	seenT := false
	for item := range strings.SplitSeq(value, ",") {
		key, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			continue
		}
		switch key {
		case stripeTimestampKey:
			if seenT {
				return stripeHeader{}, errors.New("more than one t= timestamp")
			}
			seenT = true
			t, ok := parseUnix(val)
			if !ok {
				return stripeHeader{}, errors.New("t= is not a Unix time in seconds")
			}
			out.timestamp, out.t = val, t
		case stripeSignatureV1:
			sig, err := decodeHexMAC(val)
			if err != nil || len(out.v1) == maxSignaturesPerHeader {
				continue
			}
			out.v1 = append(out.v1, sig)
		}
	}
	if !seenT {
		return stripeHeader{}, errors.New("no t= timestamp")
	}
	if len(out.v1) == 0 {
		return stripeHeader{}, errors.New("no readable v1= signature (only v1 is accepted)")
	}
	return out, nil
}

// Verify implements Verifier.
func (v *stripeVerifier) Verify(h http.Header, body []byte, now time.Time) error {
	value := h.Get(HeaderStripeSignature)
	if value == "" {
		return sigErr("the %s header is missing", HeaderStripeSignature)
	}
	sh, err := parseStripeHeader(value)
	if err != nil {
		return sigErr("%s: %v", HeaderStripeSignature, err)
	}
	if err := checkTimestamp(HeaderStripeSignature+" timestamp (t=)", sh.t, now, v.tolerance); err != nil {
		return err
	}
	prefix := []byte(sh.timestamp + ".")
	if !anyMatch(v.keys, sh.v1, func(k *keyedmac.Key) []byte { return k.Sum(nil, prefix, body) }) {
		return sigErr("no %s v1 signature matches the body (wrong secret, or the body or timestamp was changed)", HeaderStripeSignature)
	}
	return nil
}

// SignStripe returns the Stripe-Signature value ("t=<unix>,v1=<hex>") for
// body at ts. The HMAC key is the whole secret string, verbatim.
func SignStripe(secret string, ts time.Time, body []byte) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	return "t=" + t + ",v1=" + hex.EncodeToString(hmacSHA256([]byte(secret), []byte(t+"."), body))
}
