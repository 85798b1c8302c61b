package delivery

import (
	"crypto/sha256"
	"encoding/base64"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/keyedmac"
)

// signer makes one target's webhook-signature values, the same as
// intake.SignStandardWebhooks with the target's secret (a test holds the
// two to it), but with the secret decoded and its HMAC keyed once, not on
// every attempt. It is safe for concurrent use.
type signer struct{ key *keyedmac.Key }

// newSigner returns a signer for secret ("whsec_" and base64, or the base64
// alone), or an error when it is neither (Target.Validate reports it).
func newSigner(secret string) (*signer, error) {
	key, err := backstop.DecodeWebhookSecret(secret)
	if err != nil {
		return nil, err
	}
	return &signer{key: keyedmac.New(key)}, nil
}

// sign returns the webhook-signature value ("v1,<base64>") of body sent as
// message id at timestamp ts (Unix seconds, as the webhook-timestamp header
// says).
func (s *signer) sign(id, ts string, body []byte) string {
	var buf [128]byte
	prefix := append(append(append(append(buf[:0], id...), '.'), ts...), '.')
	var sum [sha256.Size]byte
	const version = "v1,"
	var out [len(version) + 44]byte // 44: base64 of a SHA-256 sum
	copy(out[:], version)
	base64.StdEncoding.Encode(out[len(version):], s.key.Sum(sum[:0], prefix, body))
	return string(out[:])
}
