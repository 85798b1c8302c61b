package backstop

import "testing"

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://billing.example.com/hooks", "https://billing.example.com/hooks"},
		{"https://billing.example.com/hooks/payments-incoming", "https://billing.example.com/hooks/payments-incoming"},
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"redis://:s3cret@10.0.0.7:6379/2", "redis://:xxxxx@10.0.0.7:6379/2"},
		{"rediss://user:s3cret@cache.example.com:6380/0", "rediss://user:xxxxx@cache.example.com:6380/0"},
		{"https://crm.example.com/in?token=abc123&tenant=7", "https://crm.example.com/in?tenant=xxxxx&token=xxxxx"},
		// Discord: the id stays, the token goes.
		{"https://discord.com/api/webhooks/123456789012345678/Ab1-cD2_eF3gH4iJ5kL6mN7oP8qR9sT0uV1wX2yZ3aB4cD5eF6gH7iJ8kL9mN0oP1qR2sT3u",
			"https://discord.com/api/webhooks/123456789012345678/xxxxx"},
		// Slack: T…/B…/token.
		{"https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX1", "https://hooks.slack.com/services/T00000000/B00000000/xxxxx"},
		{"https://inspector.example.com/in/550e8400-e29b-41d4-a716-446655440000", "https://inspector.example.com/in/xxxxx"},
		{"https://a.example.com/x#frag-secret", "https://a.example.com/x"},
		// A user name alone is most often a token.
		{"https://sk_live_51HxyzSecretToken@api.example.com/hooks", "https://xxxxx@api.example.com/hooks"},
		{"mailto:someone@example.com", "mailto:xxxxx"},
		{"redis://:s3cret@[::1", "(unreadable URL)"},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
