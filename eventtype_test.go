package backstop

import (
	"encoding/json"
	"testing"
)

func TestEventTypeFor(t *testing.T) {
	tests := []struct {
		r       Resource
		data    string
		missing bool
		want    string
	}{
		{Contacts, `{"id":"ct_1"}`, true, "contact.created"},
		{Contacts, `{"id":"ct_1"}`, false, "contact.updated"},
		{Messages, `{"id":"msg_1"}`, true, "message.created"},
		{Messages, `{"id":"msg_1"}`, false, "message.updated"},
		{Chats, `{"id":"chat_1","status":"opened"}`, true, "chat.opened"},
		{Chats, `{"id":"chat_1","status":"closed"}`, false, "chat.closed"},
		{Chats, `{"id":"chat_1","status":"closed"}`, true, "chat.closed"},
		{Payments, `{"id":"pay_1","status":"pending"}`, true, "payment.pending"},
		{Payments, `{"id":"pay_1","status":"succeeded"}`, false, "payment.succeeded"},
		{Payments, `{"id":"pay_1","status":"failed"}`, false, "payment.failed"},
		{Payments, `{"id":"pay_1","status":"refunded"}`, true, "payment.refunded"},
		{Payments, `{"id":"pay_1"}`, false, ""},
		{Payments, `{"id":"pay_1","status":7}`, false, ""},
		{Chats, `not json`, false, ""},
		{Resource("invoices"), `{"status":"paid"}`, true, ""},
	}
	for _, tt := range tests {
		got := EventTypeFor(tt.r, json.RawMessage(tt.data), tt.missing)
		if got != tt.want {
			t.Errorf("EventTypeFor(%s, %s, missing=%v) = %q, want %q", tt.r, tt.data, tt.missing, got, tt.want)
		}
		if got != "" {
			if r, ok := ResourceOfEventType(got); !ok || r != tt.r {
				t.Errorf("%q names resource %q, want %q", got, r, tt.r)
			}
		}
	}
}
