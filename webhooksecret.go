package backstop

import (
	"encoding/base64"
	"errors"
	"strings"
)

// ErrWebhookSecret is the error of a Standard Webhooks secret that is not
// one. Its text never contains the secret.
var ErrWebhookSecret = errors.New(`not a Standard Webhooks secret (want base64, usually after "whsec_")`)

// DecodeWebhookSecret returns the HMAC key of a Standard Webhooks secret:
// "whsec_" and base64, or the base64 alone. The intake's standard-webhooks
// scheme, the delivery signer and the configuration's checks all read
// secrets through it.
func DecodeWebhookSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(key) == 0 {
		return nil, ErrWebhookSecret
	}
	return key, nil
}
