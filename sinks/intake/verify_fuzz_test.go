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

// The fuzz targets below feed arbitrary header values and bodies to the
// header parsers and to Verify. Properties: nothing panics; every failure
// wraps ErrSignature; a success is only possible when the header carries
// the correct signature, recomputed here independently of verify.go.
// Seeds live in testdata/fuzz/<FuzzName>.

const (
	fuzzBotixSecret  = "botix-fuzz-secret"
	fuzzGitHubSecret = ghVectorSecret
	fuzzStripeSecret = "whsec_stripe_fuzz_secret"
)

// fuzzNow is the clock of the timestamped fuzz targets: the Standard
// Webhooks vector's timestamp, so its seed verifies.
var fuzzNow = swVectorNow

func independentMAC(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

func oneHeader(key, value string) http.Header {
	h := http.Header{}
	h.Set(key, value)
	return h
}

func checkFailure(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrSignature) {
		t.Fatalf("error %v does not wrap ErrSignature", err)
	}
}

func FuzzBotixHeader(f *testing.F) {
	body := []byte(`{"event_id":"evt_1"}`)
	f.Add(SignBotix(fuzzBotixSecret, body), body)
	v := mustVerifier(f, SchemeBotix, SchemeOptions{Secrets: []string{"other-secret", fuzzBotixSecret}})
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		if sig, err := parseBotixHeader(header); err == nil && len(sig) != sha256.Size {
			t.Fatalf("parseBotixHeader(%q) = %d bytes", header, len(sig))
		}
		err := v.Verify(oneHeader(HeaderBotixSignature, header), body, fuzzNow)
		checkFailure(t, err)
		if err != nil {
			return
		}
		want := hex.EncodeToString(independentMAC([]byte(fuzzBotixSecret), string(body)))
		got := strings.TrimSpace(header)
		if len(got) > 64 {
			got = got[len(got)-64:] // after an optional "sha256="
		}
		if !strings.EqualFold(got, want) {
			t.Fatalf("Verify accepted %q for a body whose signature is %s", header, want)
		}
	})
}

func FuzzGitHubHeader(f *testing.F) {
	f.Add(ghVectorSignature, []byte(ghVectorPayload))
	v := mustVerifier(f, SchemeGitHub, SchemeOptions{Secrets: []string{fuzzGitHubSecret}})
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		if sig, err := parseGitHubHeader(header); err == nil && len(sig) != sha256.Size {
			t.Fatalf("parseGitHubHeader(%q) = %d bytes", header, len(sig))
		}
		err := v.Verify(oneHeader(HeaderGitHubSignature, header), body, fuzzNow)
		checkFailure(t, err)
		if err != nil {
			return
		}
		want := "sha256=" + hex.EncodeToString(independentMAC([]byte(fuzzGitHubSecret), string(body)))
		if got := strings.TrimSpace(header); !strings.HasPrefix(got, "sha256=") || !strings.EqualFold(got, want) {
			t.Fatalf("Verify accepted %q for a body whose signature is %s", header, want)
		}
	})
}

func FuzzStandardWebhooksHeader(f *testing.F) {
	f.Add(swVectorID, strconv.Itoa(swVectorTimestamp), swVectorSignature, []byte(swVectorPayload))
	v := mustVerifier(f, SchemeStandardWebhooks, SchemeOptions{Secrets: []string{swVectorSecret}})
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(swVectorSecret, "whsec_"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, timestamp, signature string, body []byte) {
		if sigs, err := parseStandardSignatures(signature); err == nil {
			for _, s := range sigs {
				if len(s) != sha256.Size {
					t.Fatalf("parseStandardSignatures(%q) returned a %d-byte signature", signature, len(s))
				}
			}
		}
		h := http.Header{}
		h.Set(HeaderWebhookID, id)
		h.Set(HeaderWebhookTimestamp, timestamp)
		h.Set(HeaderWebhookSignature, signature)
		err := v.Verify(h, body, fuzzNow)
		checkFailure(t, err)
		if err != nil {
			return
		}
		ts, perr := strconv.ParseInt(timestamp, 10, 64)
		if perr != nil || strings.Trim(timestamp, "0123456789") != "" {
			t.Fatalf("Verify accepted timestamp %q", timestamp)
		}
		if d := fuzzNow.Sub(time.Unix(ts, 0)).Abs(); d > DefaultTolerance {
			t.Fatalf("Verify accepted timestamp %q, %v from now", timestamp, d)
		}
		want := independentMAC(key, id, ".", timestamp, ".", string(body))
		for _, field := range strings.Fields(signature) {
			b64, ok := strings.CutPrefix(field, "v1,")
			if !ok {
				continue
			}
			if got, err := base64.StdEncoding.DecodeString(b64); err == nil && bytes.Equal(got, want) {
				return
			}
		}
		t.Fatalf("Verify accepted %q without the correct v1 signature", signature)
	})
}

func FuzzStripeHeader(f *testing.F) {
	body := []byte(`{"id":"evt_1","object":"event"}`)
	f.Add(SignStripe(fuzzStripeSecret, fuzzNow, body), body)
	v := mustVerifier(f, SchemeStripe, SchemeOptions{Secrets: []string{fuzzStripeSecret}})
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		if sh, err := parseStripeHeader(header); err == nil {
			if sh.timestamp == "" || len(sh.v1) == 0 {
				t.Fatalf("parseStripeHeader(%q) = %+v without t or v1", header, sh)
			}
			for _, s := range sh.v1 {
				if len(s) != sha256.Size {
					t.Fatalf("parseStripeHeader(%q) returned a %d-byte signature", header, len(s))
				}
			}
		}
		err := v.Verify(oneHeader(HeaderStripeSignature, header), body, fuzzNow)
		checkFailure(t, err)
		if err != nil {
			return
		}
		var stamps, v1s []string
		for item := range strings.SplitSeq(header, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(item), "=")
			if !ok {
				continue
			}
			switch k {
			case "t":
				stamps = append(stamps, val)
			case "v1":
				v1s = append(v1s, val)
			}
		}
		if len(stamps) != 1 {
			t.Fatalf("Verify accepted %q with %d timestamps", header, len(stamps))
		}
		ts, perr := strconv.ParseInt(stamps[0], 10, 64)
		if perr != nil || fuzzNow.Sub(time.Unix(ts, 0)).Abs() > DefaultTolerance {
			t.Fatalf("Verify accepted %q: timestamp unreadable or out of tolerance", header)
		}
		want := independentMAC([]byte(fuzzStripeSecret), stamps[0], ".", string(body))
		for _, s := range v1s {
			if got, err := hex.DecodeString(s); err == nil && bytes.Equal(got, want) {
				return
			}
		}
		t.Fatalf("Verify accepted %q without the correct v1 signature", header)
	})
}
