package delivery

import (
	"strconv"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sinks/intake"
)

// TestSignerMatchesIntake holds signer to intake.SignStandardWebhooks, the
// one statement of the Standard Webhooks signing rule, for secrets with and
// without their prefix, and across reuses of its HMACs.
func TestSignerMatchesIntake(t *testing.T) {
	bareSecret := "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cases := []struct {
		secret, id string
		ts         time.Time
		body       string
	}{
		{testSecret, "evt_1", time.Unix(1767225600, 0), `{"event_id":"evt_1"}`},
		{testSecret, "evt_2", time.Unix(1767225601, 0), ``},
		{testSecret, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), `{"test": 2432232314}`},
		{"whsec_" + bareSecret, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), `{"test": 2432232314}`},
		{bareSecret, "evt_3", time.Unix(0, 0), `{"data":{"id":"ct_1"}}`},
	}
	signers := map[string]*signer{}
	for round := range 3 { // later rounds reuse the pooled HMACs
		for _, c := range cases {
			s := signers[c.secret]
			if s == nil {
				var err error
				if s, err = newSigner(c.secret); err != nil {
					t.Fatalf("newSigner(%q): %v", c.secret, err)
				}
				signers[c.secret] = s
			}
			want, err := intake.SignStandardWebhooks(c.secret, c.id, c.ts, []byte(c.body))
			if err != nil {
				t.Fatalf("intake sign: %v", err)
			}
			if got := s.sign(c.id, strconv.FormatInt(c.ts.Unix(), 10), []byte(c.body)); got != want {
				t.Errorf("round %d, %s at %d: sign = %q, intake says %q", round, c.id, c.ts.Unix(), got, want)
			}
		}
	}
}

// TestNewSignerRefusesBadSecrets checks that a secret intake refuses is
// refused here too.
func TestNewSignerRefusesBadSecrets(t *testing.T) {
	for _, secret := range []string{"whsec_", "whsec_not base64!", "%%%"} {
		if _, err := intake.SignStandardWebhooks(secret, "id", time.Unix(0, 0), nil); err == nil {
			t.Fatalf("intake accepts %q; pick another bad secret", secret)
		}
		if _, err := newSigner(secret); err == nil {
			t.Errorf("newSigner(%q) succeeded, want an error", secret)
		}
	}
}
