package backstop

import (
	"encoding/json"
)

// EventTypeFor names the event that announces an object's current state,
// the one rule shared by every part that makes events itself
// (reconciliation, sync): contacts and messages are "<kind>.created" when
// the object is missing locally and "<kind>.updated" otherwise; chats are
// "chat.<status>" (opened, closed) and payments "payment.<status>" (pending,
// succeeded, failed, refunded) whether missing or not, since their status
// is what the platform announces.
//
// It returns "" when no type can be named: an unknown resource, or a chat
// or payment whose data has no string status.
func EventTypeFor(r Resource, data json.RawMessage, missing bool) string {
	switch r {
	case Contacts, Messages:
		kind := "contact"
		if r == Messages {
			kind = "message"
		}
		if missing {
			return kind + ".created"
		}
		return kind + ".updated"
	case Chats, Payments:
		var v struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(data, &v) != nil || v.Status == "" {
			return ""
		}
		if r == Chats {
			return "chat." + v.Status
		}
		return "payment." + v.Status
	}
	return ""
}
