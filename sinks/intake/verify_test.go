package intake

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Standard Webhooks published test vector, from the reference libraries of
// github.com/standard-webhooks/standard-webhooks (libraries/*: the
// "sign function works" tests, e.g. libraries/php testSignFunctionWorks,
// and the same vector in the Svix libraries it came from).
const (
	swVectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swVectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	swVectorTimestamp = 1614265330
	swVectorPayload   = `{"test": 2432232314}`
	swVectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// GitHub published test values, from "Validating webhook deliveries",
// section "Testing the webhook payload validation":
// https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
const (
	ghVectorSecret    = "It's a Secret to Everybody"
	ghVectorPayload   = "Hello, World!"
	ghVectorSignature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
)

var swVectorNow = time.Unix(swVectorTimestamp, 0)

func mustVerifier(t testing.TB, scheme string, opts SchemeOptions) Verifier {
	t.Helper()
	v, err := NewVerifier(scheme, opts)
	if err != nil {
		t.Fatalf("NewVerifier(%q): %v", scheme, err)
	}
	return v
}

func swHeader(id string, ts int64, sig string) http.Header {
	h := http.Header{}
	h.Set(HeaderWebhookID, id)
	h.Set(HeaderWebhookTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderWebhookSignature, sig)
	return h
}

func TestStandardWebhooksPublishedVector(t *testing.T) {
	body := []byte(swVectorPayload)

	got, err := SignStandardWebhooks(swVectorSecret, swVectorID, swVectorNow, body)
	if err != nil || got != swVectorSignature {
		t.Fatalf("SignStandardWebhooks = %q, %v; want %q", got, err, swVectorSignature)
	}
	got, err = SignStandardWebhooks(strings.TrimPrefix(swVectorSecret, "whsec_"), swVectorID, swVectorNow, body)
	if err != nil || got != swVectorSignature {
		t.Fatalf("SignStandardWebhooks without whsec_ = %q, %v; want %q", got, err, swVectorSignature)
	}

	other, err := SignStandardWebhooks("whsec_"+base64.StdEncoding.EncodeToString([]byte("another secret")), swVectorID, swVectorNow, body)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, secret, sig string
	}{
		{"with whsec_ prefix", swVectorSecret, swVectorSignature},
		{"without whsec_ prefix", strings.TrimPrefix(swVectorSecret, "whsec_"), swVectorSignature},
		{"valid one last among several", swVectorSecret, other + " v1,bm9wZQ== v2,abc " + swVectorSignature},
		{"valid one first among several", swVectorSecret, swVectorSignature + " " + other},
		{"unknown versions around it", swVectorSecret, "v1a,xyz " + swVectorSignature + " v2,AAAA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := mustVerifier(t, SchemeStandardWebhooks, SchemeOptions{Secrets: []string{tc.secret}})
			if err := v.Verify(swHeader(swVectorID, swVectorTimestamp, tc.sig), body, swVectorNow); err != nil {
				t.Fatalf("Verify: %v", err)
			}
		})
	}

	v := mustVerifier(t, SchemeStandardWebhooks, SchemeOptions{Secrets: []string{swVectorSecret}})
	if err := v.Verify(swHeader(swVectorID, swVectorTimestamp, other), body, swVectorNow); !errors.Is(err, ErrSignature) {
		t.Fatalf("only a wrong signature: err = %v, want ErrSignature", err)
	}
	if err := v.Verify(swHeader(swVectorID+"x", swVectorTimestamp, swVectorSignature), body, swVectorNow); !errors.Is(err, ErrSignature) {
		t.Fatalf("changed webhook-id: err = %v, want ErrSignature", err)
	}
	// The signature spans several header lines too.
	h := swHeader(swVectorID, swVectorTimestamp, other)
	h.Add(HeaderWebhookSignature, swVectorSignature)
	if err := v.Verify(h, body, swVectorNow); err != nil {
		t.Fatalf("signature in a second header line: %v", err)
	}
}

func TestGitHubPublishedVector(t *testing.T) {
	body := []byte(ghVectorPayload)
	if got := SignGitHub(ghVectorSecret, body); got != ghVectorSignature {
		t.Fatalf("SignGitHub = %q, want %q", got, ghVectorSignature)
	}
	v := mustVerifier(t, SchemeGitHub, SchemeOptions{Secrets: []string{ghVectorSecret}})
	for _, sig := range []string{ghVectorSignature, "sha256=" + strings.ToUpper(strings.TrimPrefix(ghVectorSignature, "sha256="))} {
		h := http.Header{}
		h.Set(HeaderGitHubSignature, sig)
		if err := v.Verify(h, body, time.Time{}); err != nil {
			t.Fatalf("Verify(%q): %v", sig, err)
		}
	}
	h := http.Header{}
	h.Set(HeaderGitHubSignature, strings.TrimPrefix(ghVectorSignature, "sha256="))
	if err := v.Verify(h, body, time.Time{}); !errors.Is(err, ErrSignature) {
		t.Fatalf("without the sha256= prefix: err = %v, want ErrSignature", err)
	}
}

// Stripe publishes no fixed vector; its documentation ("Verify webhook
// signatures manually", https://docs.stripe.com/webhooks#verify-manually)
// defines the signed payload as "{t}.{body}" and the key as the endpoint's
// secret. This test checks SignStripe against an HMAC computed here
// independently, and that the key is the whole secret string.
func TestStripeSignature(t *testing.T) {
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("stripe endpoint secret bytes"))
	ts := time.Unix(1700000000, 0)
	body := []byte(`{"id":"evt_1","object":"event"}`)

	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte("1700000000." + string(body)))
	want := "t=1700000000,v1=" + hex.EncodeToString(mac.Sum(nil))
	if got := SignStripe(secret, ts, body); got != want {
		t.Fatalf("SignStripe = %q, want %q", got, want)
	}

	v := mustVerifier(t, SchemeStripe, SchemeOptions{Secrets: []string{secret}})
	verify := func(sig string) error {
		h := http.Header{}
		h.Set(HeaderStripeSignature, sig)
		return v.Verify(h, body, ts)
	}
	if err := verify(want); err != nil {
		t.Fatalf("Verify(SignStripe): %v", err)
	}

	// Keyed like Standard Webhooks (base64-decoded secret): must not pass.
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	swMac := hmac.New(sha256.New, key)
	swMac.Write([]byte("1700000000." + string(body)))
	swStyle := hex.EncodeToString(swMac.Sum(nil))
	if err := verify("t=1700000000,v1=" + swStyle); !errors.Is(err, ErrSignature) {
		t.Fatalf("decoded-secret signature: err = %v, want ErrSignature", err)
	}

	good := strings.TrimPrefix(want, "t=1700000000,v1=")
	for _, tc := range []struct {
		name, header string
		ok           bool
	}{
		{"several v1, one valid", "t=1700000000,v1=" + swStyle + ",v1=" + good, true},
		{"v0 and v1", "t=1700000000,v0=" + strings.Repeat("0", 64) + ",v1=" + good, true},
		{"spaces around items", "t=1700000000, v1=" + good, true},
		{"v0 only, carrying the right MAC", "t=1700000000,v0=" + good, false},
		{"v1 with another t", "t=1700000001,v1=" + good, false},
		{"two t", "t=1700000000,t=1700000000,v1=" + good, false},
		{"no t", "v1=" + good, false},
		{"signed payload without t", "t=,v1=" + good, false},
		{"negative t", "t=-1700000000,v1=" + good, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := verify(tc.header)
			if tc.ok && err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrSignature) {
				t.Fatalf("Verify: err = %v, want ErrSignature", err)
			}
		})
	}
}

// scheme describes how to sign for one scheme, so the common rules can be
// tested once for all of them.
type scheme struct {
	name    string
	secrets func(i int) string // the i-th distinct secret in the scheme's format
	sign    func(t testing.TB, secret string, ts time.Time, body []byte) http.Header
	stamped bool
}

var schemes = []scheme{
	{
		name:    SchemeBotix,
		secrets: func(i int) string { return "botix-secret-" + strconv.Itoa(i) },
		sign: func(_ testing.TB, secret string, _ time.Time, body []byte) http.Header {
			h := http.Header{}
			h.Set(HeaderBotixSignature, SignBotix(secret, body))
			return h
		},
	},
	{
		name: SchemeStandardWebhooks,
		secrets: func(i int) string {
			return "whsec_" + base64.StdEncoding.EncodeToString([]byte("standard-secret-"+strconv.Itoa(i)))
		},
		sign: func(t testing.TB, secret string, ts time.Time, body []byte) http.Header {
			sig, err := SignStandardWebhooks(secret, "msg_1", ts, body)
			if err != nil {
				t.Fatal(err)
			}
			return swHeader("msg_1", ts.Unix(), sig)
		},
		stamped: true,
	},
	{
		name:    SchemeGitHub,
		secrets: func(i int) string { return "github-secret-" + strconv.Itoa(i) },
		sign: func(_ testing.TB, secret string, _ time.Time, body []byte) http.Header {
			h := http.Header{}
			h.Set(HeaderGitHubSignature, SignGitHub(secret, body))
			return h
		},
	},
	{
		name:    SchemeStripe,
		secrets: func(i int) string { return "whsec_stripe" + strconv.Itoa(i) },
		sign: func(_ testing.TB, secret string, ts time.Time, body []byte) http.Header {
			h := http.Header{}
			h.Set(HeaderStripeSignature, SignStripe(secret, ts, body))
			return h
		},
		stamped: true,
	},
}

func TestVerifySchemes(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	body := []byte(`{"event_id":"evt_1","event":"payment.succeeded","data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z"}}`)
	flipped := bytes.Clone(body)
	flipped[len(flipped)/2] ^= 0x01

	for _, s := range schemes {
		a, b, c := s.secrets(1), s.secrets(2), s.secrets(3)
		type tc struct {
			name    string
			secrets []string
			h       http.Header
			body    []byte
			now     time.Time
			ok      bool
		}
		cases := []tc{
			{"valid", []string{a}, s.sign(t, a, now, body), body, now, true},
			{"flipped body byte", []string{a}, s.sign(t, a, now, body), flipped, now, false},
			{"wrong secret", []string{a}, s.sign(t, b, now, body), body, now, false},
			{"rotation: second secret signs", []string{a, b}, s.sign(t, b, now, body), body, now, true},
			{"rotation: neither secret signs", []string{a, b}, s.sign(t, c, now, body), body, now, false},
			{"no headers", []string{a}, http.Header{}, body, now, false},
			{"empty body signed", []string{a}, s.sign(t, a, now, nil), nil, now, true},
		}
		if s.stamped {
			cases = append(cases,
				tc{"too old", []string{a}, s.sign(t, a, now.Add(-5*time.Minute-time.Second), body), body, now, false},
				tc{"too new", []string{a}, s.sign(t, a, now.Add(5*time.Minute+time.Second), body), body, now, false},
				tc{"old, at the tolerance", []string{a}, s.sign(t, a, now.Add(-5*time.Minute), body), body, now, true},
				tc{"new, at the tolerance", []string{a}, s.sign(t, a, now.Add(5*time.Minute), body), body, now, true},
				tc{"a day old", []string{a}, s.sign(t, a, now.Add(-24*time.Hour), body), body, now, false},
			)
		} else {
			cases = append(cases,
				tc{"no timestamp: a day later is fine", []string{a}, s.sign(t, a, now, body), body, now.Add(24 * time.Hour), true},
			)
		}
		for _, c := range cases {
			t.Run(s.name+"/"+c.name, func(t *testing.T) {
				v := mustVerifier(t, s.name, SchemeOptions{Secrets: c.secrets})
				err := v.Verify(c.h, c.body, c.now)
				if c.ok {
					if err != nil {
						t.Fatalf("Verify: %v", err)
					}
					return
				}
				if !errors.Is(err, ErrSignature) {
					t.Fatalf("Verify: err = %v, want ErrSignature", err)
				}
				assertNoSecretIn(t, err, c.secrets, s.sign(t, c.secrets[0], c.now, c.body))
			})
		}
	}
}

// assertNoSecretIn fails when err's message contains a secret or any
// value of the expected (correct) signature headers.
func assertNoSecretIn(t *testing.T, err error, secrets []string, expected http.Header) {
	t.Helper()
	msg := err.Error()
	for _, s := range secrets {
		if strings.Contains(msg, s) || strings.Contains(msg, strings.TrimPrefix(s, "whsec_")) {
			t.Errorf("error %q contains a secret", msg)
		}
	}
	for _, vs := range expected {
		for _, v := range vs {
			for _, part := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == '=' || r == ' ' }) {
				if len(part) >= 16 && strings.Contains(msg, part) {
					t.Errorf("error %q contains the expected signature %q", msg, part)
				}
			}
		}
	}
}

func TestVerifyTimestampMessages(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{}`)
	for _, s := range schemes {
		if !s.stamped {
			continue
		}
		v := mustVerifier(t, s.name, SchemeOptions{Secrets: []string{s.secrets(1)}, Tolerance: time.Minute})
		old := v.Verify(s.sign(t, s.secrets(1), now.Add(-2*time.Minute), body), body, now)
		if old == nil || !strings.Contains(old.Error(), "too old") {
			t.Errorf("%s: 2m old with 1m tolerance: err = %v, want a 'too old' error", s.name, old)
		}
		ahead := v.Verify(s.sign(t, s.secrets(1), now.Add(2*time.Minute), body), body, now)
		if ahead == nil || !strings.Contains(ahead.Error(), "too new") {
			t.Errorf("%s: 2m ahead with 1m tolerance: err = %v, want a 'too new' error", s.name, ahead)
		}
		if err := v.Verify(s.sign(t, s.secrets(1), now.Add(-59*time.Second), body), body, now); err != nil {
			t.Errorf("%s: 59s old with 1m tolerance: %v", s.name, err)
		}
		// Milliseconds for seconds: it said "too new: 2562047h47m16s
		// after now", time.Duration's cap.
		ms := v.Verify(s.sign(t, s.secrets(1), time.Unix(now.UnixMilli(), 0), body), body, now)
		if ms == nil || !strings.Contains(ms.Error(), "must be a Unix time in seconds (milliseconds sent?)") || strings.Contains(ms.Error(), "2562047h") {
			t.Errorf("%s: a timestamp in milliseconds: err = %v, want one saying seconds are expected", s.name, ms)
		}
	}
}

func TestNewVerifierErrors(t *testing.T) {
	const secret = "s3cr3t-value"
	for _, tc := range []struct {
		name   string
		scheme string
		opts   SchemeOptions
	}{
		{"unknown scheme", "hmac", SchemeOptions{Secrets: []string{secret}}},
		{"empty scheme", "", SchemeOptions{Secrets: []string{secret}}},
		{"no secret", SchemeBotix, SchemeOptions{}},
		{"empty secret in rotation", SchemeGitHub, SchemeOptions{Secrets: []string{secret, ""}}},
		{"standard secret not base64", SchemeStandardWebhooks, SchemeOptions{Secrets: []string{"whsec_" + secret + "!"}}},
		{"standard secret decodes to nothing", SchemeStandardWebhooks, SchemeOptions{Secrets: []string{"whsec_"}}},
		{"negative tolerance", SchemeStripe, SchemeOptions{Secrets: []string{secret}, Tolerance: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewVerifier(tc.scheme, tc.opts)
			if err == nil {
				t.Fatalf("NewVerifier = %T, want an error", v)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error %q contains the secret", err)
			}
		})
	}
	for _, name := range Schemes {
		s := "whsec_" + base64.StdEncoding.EncodeToString([]byte("k"))
		if _, err := NewVerifier(name, SchemeOptions{Secrets: []string{s}}); err != nil {
			t.Errorf("NewVerifier(%q): %v", name, err)
		}
	}
}

func TestParseBotixHeader(t *testing.T) {
	mac := hmacSHA256([]byte("k"), []byte("body"))
	lower := hex.EncodeToString(mac)
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{lower, true},
		{strings.ToUpper(lower), true},
		{"sha256=" + lower, true},
		{"SHA256=" + strings.ToUpper(lower), true},
		{"  " + lower + " ", true},
		{"", false},
		{"sha256=", false},
		{lower[:63], false},
		{lower + "0", false},
		{lower[:62] + "zz", false},
		{"sha1=" + lower, false},
		{"sha256=sha256=" + lower, false},
	} {
		got, err := parseBotixHeader(tc.in)
		if tc.ok != (err == nil) {
			t.Errorf("parseBotixHeader(%q): err = %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if tc.ok && !bytes.Equal(got, mac) {
			t.Errorf("parseBotixHeader(%q) = %x, want %x", tc.in, got, mac)
		}
	}
}

func TestParseStandardSignatures(t *testing.T) {
	mac := hmacSHA256([]byte("k"), []byte("body"))
	b64 := base64.StdEncoding.EncodeToString(mac)
	for _, tc := range []struct {
		in   string
		want int // number of v1 signatures read; -1 for an error
	}{
		{"v1," + b64, 1},
		{"v1," + b64 + " v1," + b64, 2},
		{"  v1," + b64 + "   v2," + b64 + "  ", 1},
		{"v1a," + b64 + " v1," + b64, 1},
		{"v2," + b64, -1},
		{"v1,not-base64!", -1},
		{"v1," + base64.StdEncoding.EncodeToString([]byte("short")), -1},
		{"v1", -1},
		{",", -1},
		{"", -1},
		{"   ", -1},
		{strings.Repeat("v1,"+b64+" ", maxSignaturesPerHeader+10), maxSignaturesPerHeader},
	} {
		got, err := parseStandardSignatures(tc.in)
		switch {
		case tc.want < 0 && err == nil:
			t.Errorf("parseStandardSignatures(%.40q) = %d signatures, want an error", tc.in, len(got))
		case tc.want >= 0 && err != nil:
			t.Errorf("parseStandardSignatures(%.40q): %v", tc.in, err)
		case tc.want >= 0 && len(got) != tc.want:
			t.Errorf("parseStandardSignatures(%.40q) = %d signatures, want %d", tc.in, len(got), tc.want)
		}
	}
}

func TestParseStripeHeader(t *testing.T) {
	h := hex.EncodeToString(hmacSHA256([]byte("k"), []byte("body")))
	for _, tc := range []struct {
		in     string
		wantTS string
		wantV1 int // -1 for an error
	}{
		{"t=1,v1=" + h, "1", 1},
		{"v1=" + h + ",t=1614265330", "1614265330", 1},
		{"t=5,v1=" + h + ",v1=" + h + ",v0=" + h, "5", 2},
		{"t=5,v1=zz,v1=" + h, "5", 1},
		{"t=5,junk,v1=" + h + ",", "5", 1},
		{"t=5,v0=" + h, "", -1},
		{"t=5", "", -1},
		{"v1=" + h, "", -1},
		{"t=x,v1=" + h, "", -1},
		{"t=+5,v1=" + h, "", -1},
		{"t=5,t=6,v1=" + h, "", -1},
		{"t=1234567890123456789,v1=" + h, "", -1},
		{"", "", -1},
		{",,,", "", -1},
	} {
		got, err := parseStripeHeader(tc.in)
		switch {
		case tc.wantV1 < 0 && err == nil:
			t.Errorf("parseStripeHeader(%q) = %+v, want an error", tc.in, got)
		case tc.wantV1 >= 0 && err != nil:
			t.Errorf("parseStripeHeader(%q): %v", tc.in, err)
		case tc.wantV1 >= 0 && (got.timestamp != tc.wantTS || len(got.v1) != tc.wantV1):
			t.Errorf("parseStripeHeader(%q) = t %q, %d v1; want t %q, %d v1", tc.in, got.timestamp, len(got.v1), tc.wantTS, tc.wantV1)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 2048)
	now := time.Unix(1_800_000_000, 0)
	for _, s := range schemes {
		b.Run(s.name, func(b *testing.B) {
			v := mustVerifier(b, s.name, SchemeOptions{Secrets: []string{s.secrets(1), s.secrets(2)}})
			h := s.sign(b, s.secrets(2), now, body)
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := v.Verify(h, body, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A webhook-id as long as backstop's own delivery sends one, for the
// longest id it takes (MaxIDBytes of non-ASCII, percent-encoded: three
// bytes each), verifies: a backstop behind a backstop refused it as
// longer than 256 bytes. One longer still is refused.
func TestStandardWebhooksTakeTheHeaderFormOfTheLongestID(t *testing.T) {
	body := []byte(swVectorPayload)
	v := mustVerifier(t, SchemeStandardWebhooks, SchemeOptions{Secrets: []string{swVectorSecret}})
	for _, c := range []struct {
		id string
		ok bool
	}{
		{strings.Repeat("%C3", MaxIDBytes), true},
		{strings.Repeat("%C3", MaxIDBytes) + "x", false},
	} {
		sig, err := SignStandardWebhooks(swVectorSecret, c.id, swVectorNow, body)
		if err != nil {
			t.Fatal(err)
		}
		err = v.Verify(swHeader(c.id, swVectorTimestamp, sig), body, swVectorNow)
		if c.ok && err != nil || !c.ok && !errors.Is(err, ErrSignature) {
			t.Errorf("a webhook-id of %d bytes: %v, want ok=%v", len(c.id), err, c.ok)
		}
	}
}
