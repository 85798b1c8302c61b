package delivery

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"sync"

	"github.com/backstop-sync/backstop"
)

// signer makes one target's webhook-signature values, the same as
// intake.SignStandardWebhooks with the target's secret (a test holds the
// two to it), but with the secret decoded once and the HMAC reused from
// one attempt to the next, so that signing costs an attempt only the
// value it sends. It is safe for concurrent use.
type signer struct {
	key  []byte
	macs sync.Pool // of *mac
}

// mac is one HMAC-SHA256 keyed with a signer's key and the buffers it
// writes into.
type mac struct {
	h      hash.Hash
	prefix []byte // "<id>.<timestamp>."
	sum    []byte
}

// newSigner returns a signer for secret ("whsec_" and base64, or the base64
// alone), or an error when it is neither (Target.Validate reports it).
func newSigner(secret string) (*signer, error) {
	key, err := backstop.DecodeWebhookSecret(secret)
	if err != nil {
		return nil, err
	}
	s := &signer{key: key}
	s.macs.New = func() any { return &mac{h: hmac.New(sha256.New, s.key)} }
	return s, nil
}

// sign returns the webhook-signature value ("v1,<base64>") of body sent as
// message id at timestamp ts (Unix seconds, as the webhook-timestamp header
// says).
func (s *signer) sign(id, ts string, body []byte) string {
	m := s.macs.Get().(*mac)
	defer s.macs.Put(m)
	m.h.Reset()
	m.prefix = append(append(append(append(m.prefix[:0], id...), '.'), ts...), '.')
	m.h.Write(m.prefix)
	m.h.Write(body)
	m.sum = m.h.Sum(m.sum[:0])
	const version = "v1,"
	var out [len(version) + 44]byte // 44: base64 of a SHA-256 sum
	copy(out[:], version)
	base64.StdEncoding.Encode(out[len(version):], m.sum)
	return string(out[:])
}
