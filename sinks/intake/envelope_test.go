package intake

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

func TestParseEnvelopeAccepts(t *testing.T) {
	payData := `{"id":"pay_1","amount":1500,"currency":"EUR","updated_at":"2026-03-01T12:00:00.123456Z","note":"caf\u00e9 ☕"}`
	for _, tc := range []struct {
		name string
		body string
		want backstop.Event
	}{
		{
			name: "payment",
			body: `{"event_id":"evt_1","event":"payment.succeeded","created_at":"2026-03-01T12:00:01Z","data":` + payData + `}`,
			want: backstop.Event{
				ID: "evt_1", Type: "payment.succeeded", Resource: backstop.Payments,
				ObjectID: "pay_1", UpdatedAt: time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC),
				CreatedAt: time.Date(2026, 3, 1, 12, 0, 1, 0, time.UTC),
				Origin:    backstop.OriginWebhook, Data: json.RawMessage(payData),
			},
		},
		{
			name: "whitespace everywhere, offset times, no created_at",
			body: " \n{ \"data\" :\t{ \"updated_at\" : \"2026-03-01T14:00:00+02:00\", \"id\" : \"ct_9\" } ,\"event\":\"contact.updated\", \"event_id\":\"evt_2\" }\n ",
			want: backstop.Event{
				ID: "evt_2", Type: "contact.updated", Resource: backstop.Contacts,
				ObjectID: "ct_9", UpdatedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
				Origin: backstop.OriginWebhook, Data: json.RawMessage(`{ "updated_at" : "2026-03-01T14:00:00+02:00", "id" : "ct_9" }`),
			},
		},
		{
			name: "truncated, no updated_at",
			body: `{"event_id":"evt_3","event":"message.created","data":{"id":"msg_1"},"truncated":true}`,
			want: backstop.Event{
				ID: "evt_3", Type: "message.created", Resource: backstop.Messages, ObjectID: "msg_1",
				Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"id":"msg_1"}`), Truncated: true,
			},
		},
		{
			name: "truncated with updated_at keeps UpdatedAt zero until fetched",
			body: `{"event_id":"evt_4","event":"chat.closed","data":{"id":"chat_1","updated_at":"2026-03-01T12:00:00Z"},"truncated":true}`,
			want: backstop.Event{
				ID: "evt_4", Type: "chat.closed", Resource: backstop.Chats, ObjectID: "chat_1",
				Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"id":"chat_1","updated_at":"2026-03-01T12:00:00Z"}`), Truncated: true,
			},
		},
		{
			name: "truncated false is an ordinary event",
			body: `{"event_id":"evt_5","event":"chat.opened","data":{"id":"chat_2","updated_at":"2026-03-01T12:00:00Z"},"truncated":false}`,
			want: backstop.Event{
				ID: "evt_5", Type: "chat.opened", Resource: backstop.Chats, ObjectID: "chat_2",
				UpdatedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
				Origin:    backstop.OriginWebhook, Data: json.RawMessage(`{"id":"chat_2","updated_at":"2026-03-01T12:00:00Z"}`),
			},
		},
		{
			name: "unknown type with any object",
			body: `{"event_id":"evt_6","event":"invoice.paid","data":{"whatever":[1,2]}}`,
			want: backstop.Event{ID: "evt_6", Type: "invoice.paid", Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"whatever":[1,2]}`)},
		},
		{
			name: "nested objects with keys of their own, the same in siblings",
			body: `{"event_id":"evt_8","event":"order.placed","data":{"id":"o_1","lines":[{"sku":"a","qty":1},{"sku":"b","qty":2,"meta":{"id":"m","sku":"c"}}],"id2":{"id":1},"e":[],"o":{}}}`,
			want: backstop.Event{ID: "evt_8", Type: "order.placed", Origin: backstop.OriginWebhook,
				Data: json.RawMessage(`{"id":"o_1","lines":[{"sku":"a","qty":1},{"sku":"b","qty":2,"meta":{"id":"m","sku":"c"}}],"id2":{"id":1},"e":[],"o":{}}`)},
		},
		{
			name: "unknown type without data, nulls count as absent",
			body: `{"event_id":"evt_7","event":"ping","data":null,"created_at":null,"truncated":null}`,
			want: backstop.Event{ID: "evt_7", Type: "ping", Origin: backstop.OriginWebhook},
		},
		{
			name: "unknown keys ignored, escapes decoded",
			body: `{"event_id":"evt_\u00e9","event":"payment.failed","extra":{"a":1},"data":{"id":"pay_\u0041","updated_at":"2026-03-01T12:00:00Z"}}`,
			want: backstop.Event{
				ID: "evt_é", Type: "payment.failed", Resource: backstop.Payments, ObjectID: "pay_A",
				UpdatedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
				Origin:    backstop.OriginWebhook, Data: json.RawMessage(`{"id":"pay_\u0041","updated_at":"2026-03-01T12:00:00Z"}`),
			},
		},
		{
			name: "ids of exactly MaxIDBytes",
			body: `{"event_id":"` + strings.Repeat("e", MaxIDBytes) + `","event":"x.y"}`,
			want: backstop.Event{ID: strings.Repeat("e", MaxIDBytes), Type: "x.y", Origin: backstop.OriginWebhook},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEnvelope([]byte(tc.body))
			if err != nil {
				t.Fatalf("ParseEnvelope: %v", err)
			}
			if string(got.Data) != string(tc.want.Data) {
				t.Errorf("Data = %s, want the exact bytes %s", got.Data, tc.want.Data)
			}
			got.Data, tc.want.Data = nil, nil
			if !got.UpdatedAt.Equal(tc.want.UpdatedAt) || !got.CreatedAt.Equal(tc.want.CreatedAt) {
				t.Errorf("times = %v, %v; want %v, %v", got.UpdatedAt, got.CreatedAt, tc.want.UpdatedAt, tc.want.CreatedAt)
			}
			got.UpdatedAt, got.CreatedAt, tc.want.UpdatedAt, tc.want.CreatedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if got.ID != tc.want.ID || got.Type != tc.want.Type || got.Resource != tc.want.Resource ||
				got.ObjectID != tc.want.ObjectID || got.Origin != tc.want.Origin || got.Truncated != tc.want.Truncated {
				t.Errorf("ParseEnvelope = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseEnvelopeDedupKey(t *testing.T) {
	// The same version announced with two spellings of one instant gets one
	// dedup key.
	a, err := ParseEnvelope([]byte(`{"event_id":"evt_a","event":"payment.succeeded","data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseEnvelope([]byte(`{"event_id":"evt_b","event":"payment.refunded","data":{"id":"pay_1","updated_at":"2026-03-01T13:00:00.000000+01:00"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if a.DedupKey() == "" || a.DedupKey() != b.DedupKey() {
		t.Fatalf("dedup keys %q and %q, want one non-empty key", a.DedupKey(), b.DedupKey())
	}
	tr, err := ParseEnvelope([]byte(`{"event_id":"evt_c","event":"payment.succeeded","data":{"id":"pay_1"},"truncated":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if tr.DedupKey() != "" {
		t.Fatalf("truncated event dedup key = %q, want none until fetched", tr.DedupKey())
	}
}

func TestParseEnvelopeRejects(t *testing.T) {
	ok := `"event_id":"evt_1","event":"payment.succeeded"`
	okData := `"data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z"}`
	for _, tc := range []struct {
		name, body, msg string
	}{
		{"empty body", ``, "body is not valid JSON"},
		{"whitespace only", "  \n", "body is not valid JSON"},
		{"not JSON", `event_id=evt_1`, "body is not valid JSON"},
		{"truncated JSON", `{"event_id":"evt_1"`, "body is not valid JSON"},
		{"trailing garbage", `{` + ok + `,` + okData + `}x`, "body is not valid JSON"},
		{"two objects", `{` + ok + `,` + okData + `}{}`, "body is not valid JSON"},
		{"array", `[{` + ok + `,` + okData + `}]`, "body must be a JSON object"},
		{"string", `"evt_1"`, "body must be a JSON object"},
		{"null", `null`, "body must be a JSON object"},
		{"invalid UTF-8", "{\"event_id\":\"evt_\xff\",\"event\":\"x.y\"}", "body is not valid UTF-8"},
		{"event_id missing", `{"event":"payment.succeeded",` + okData + `}`, "event_id is missing"},
		{"event_id null", `{"event_id":null,"event":"x.y"}`, "event_id is missing"},
		{"event_id empty", `{"event_id":"","event":"x.y"}`, "event_id is empty"},
		{"event_id a number", `{"event_id":42,"event":"x.y"}`, "event_id must be a string"},
		{"event_id wrong case key", `{"Event_ID":"evt_1","event":"x.y"}`, "event_id is missing"},
		{"event_id NUL", `{"event_id":"evt_\u0000","event":"x.y"}`, "event_id contains a control character (U+0000)"},
		{"event_id raw newline", "{\"event_id\":\"evt\n1\",\"event\":\"x.y\"}", "body is not valid JSON"},
		{"event_id escaped newline", `{"event_id":"evt\n1","event":"x.y"}`, "event_id contains a control character (U+000A)"},
		{"event_id escaped tab", `{"event_id":"evt\t1","event":"x.y"}`, "event_id contains a control character (U+0009)"},
		{"event_id DEL", "{\"event_id\":\"evt\x7f\",\"event\":\"x.y\"}", "event_id contains a control character (U+007F)"},
		{"event_id C1", "{\"event_id\":\"evt\u0085\",\"event\":\"x.y\"}", "event_id contains a control character (U+0085)"},
		{"event_id C1 escaped", `{"event_id":"evt\u009f","event":"x.y"}`, "event_id contains a control character (U+009F)"},
		{"event_id lone surrogate", `{"event_id":"evt\ud800","event":"x.y"}`, "event_id contains U+FFFD"},
		{"event_id too long", `{"event_id":"` + strings.Repeat("e", MaxIDBytes+1) + `","event":"x.y"}`, "event_id is 201 bytes long"},
		{"event missing", `{"event_id":"evt_1",` + okData + `}`, "event (the event type) is missing"},
		{"event empty", `{"event_id":"evt_1","event":""}`, "event (the event type) is empty"},
		{"event control", `{"event_id":"evt_1","event":"payment.\u001bsucceeded"}`, "event (the event type) contains a control character"},
		{"event an object", `{"event_id":"evt_1","event":{}}`, "event (the event type) must be a string"},
		{"event with a space before", `{"event_id":"evt_1","event":" contact.updated",` + okData + `}`, `event (the event type) " contact.updated" has spaces at its start or end`},
		{"event with a space after", `{"event_id":"evt_1","event":"contact.updated ",` + okData + `}`, `event (the event type) "contact.updated " has spaces at its start or end`},
		{"created_at invalid", `{` + ok + `,"created_at":"yesterday",` + okData + `}`, `created_at: invalid timestamp "yesterday"`},
		{"created_at a number", `{` + ok + `,"created_at":1614265330,` + okData + `}`, "created_at must be a string"},
		{"truncated a string", `{` + ok + `,"truncated":"yes",` + okData + `}`, "truncated must be true or false"},
		{"data an array", `{` + ok + `,"data":[]}`, "data must be a JSON object"},
		{"data a string", `{"event_id":"evt_1","event":"unknown.type","data":"{}"}`, "data must be a JSON object"},
		{"data missing for a known type", `{` + ok + `}`, "data is missing"},
		{"data.id missing", `{` + ok + `,"data":{"updated_at":"2026-03-01T12:00:00Z"}}`, "data.id is missing"},
		{"data.id a number", `{` + ok + `,"data":{"id":1,"updated_at":"2026-03-01T12:00:00Z"}}`, "data.id must be a string"},
		{"data.id control", `{` + ok + `,"data":{"id":"pay\u0007","updated_at":"2026-03-01T12:00:00Z"}}`, "data.id contains a control character"},
		{"data.id empty on truncated", `{` + ok + `,"truncated":true,"data":{"id":""}}`, "data.id is empty"},
		{"data.updated_at missing", `{` + ok + `,"data":{"id":"pay_1"}}`, "data.updated_at is missing"},
		{"data.updated_at invalid", `{` + ok + `,"data":{"id":"pay_1","updated_at":"2026-03-01 12:00"}}`, "data.updated_at: invalid timestamp"},
		{"data.updated_at invalid on truncated", `{` + ok + `,"truncated":true,"data":{"id":"pay_1","updated_at":"soon"}}`, "data.updated_at: invalid timestamp"},
		{"data.updated_at past year 9999", `{` + ok + `,"data":{"id":"pay_1","updated_at":"9999-12-31T23:30:00-01:00"}}`, "year 10000 in UTC, outside 0001 to 9999"},
		{"created_at before year 1", `{` + ok + `,"created_at":"0001-01-01T00:00:00+01:00",` + okData + `}`, "created_at: invalid timestamp"},
		{"event_id twice", `{"event_id":"evt_1","event":"payment.succeeded","event_id":"evt_2",` + okData + `}`, `body has the key "event_id" twice`},
		{"data key twice", `{` + ok + `,"data":{"id":"pay_1","status":"failed","updated_at":"2026-03-01T12:00:00Z","status":"succeeded"}}`, `data has the key "status" twice`},
		{"data key twice, escaped", `{` + ok + `,"data":{"id":"pay_1","status":"failed","updated_at":"2026-03-01T12:00:00Z","st\u0061tus":"succeeded"}}`, `data has the key "status" twice`},
		{"data key twice on an unknown type", `{"event_id":"evt_1","event":"unknown.type","data":{"a":1,"a":2}}`, `data has the key "a" twice`},
		{"event_id right-to-left override", `{"event_id":"evt_\u202e1","event":"x.y"}`, "event_id contains an invisible Unicode format character (U+202E)"},
		{"data.id zero-width space", "{" + ok + ",\"data\":{\"id\":\"pay\u200b_1\",\"updated_at\":\"2026-03-01T12:00:00Z\"}}", "data.id contains an invisible Unicode format character (U+200B)"},
		{"event BOM", `{"event_id":"evt_1","event":"\ufeffpayment.succeeded"}`, "event (the event type) contains an invisible Unicode format character (U+FEFF)"},
		{"nested key twice", `{` + ok + `,"data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z","refund":{"amount":1,"amount":1000}}}`, `data.refund has the key "amount" twice`},
		{"nested key twice in an array", `{"event_id":"evt_1","event":"unknown.type","data":{"items":[{"sku":"a"},{"sku":"b","qty":1,"qty":9}]}}`, `data.items[1] has the key "qty" twice`},
		{"nested key twice, escaped, deep", `{"event_id":"evt_1","event":"unknown.type","data":{"a b":[[{"x":{"k":1,"\u006b":2}}]]}}`, `data["a b"][0][0].x has the key "k" twice`},
		{"data key twice among many", `{` + ok + `,"data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z",` + manyKeys(40) + `,"k7":0}}`, `data has the key "k7" twice`},
		{"data number past float64", `{` + ok + `,"data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z","amount":1e999}}`, "data holds the number 1e999, too large"},
		{"data nested number past float64", `{"event_id":"evt_1","event":"unknown.type","data":{"a":[1,{"b":-2.5E+400}]}}`, "data holds the number -2.5E+400"},
		{"data number just past float64", `{` + ok + `,"data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z","n":1.8e308}}`, "data holds the number 1.8e308"},
		{"data integer of 400 digits", `{` + ok + `,"data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z","n":` + strings.Repeat("9", 400) + `}}`, "too large for a JSON parser"},
		{"over MaxBody", `{"event_id":"evt_1","event":"x.y","pad":"` + strings.Repeat("a", MaxBody) + `"}`, "more than the 65536 allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := ParseEnvelope([]byte(tc.body))
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseEnvelope = %+v, %v; want an error wrapping ErrMalformed", ev, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %q does not say %q", err, tc.msg)
			}
		})
	}
}

func TestParseEnvelopeDataIsACopy(t *testing.T) {
	body := []byte(`{"event_id":"evt_1","event":"x.y","data":{"a":1}}`)
	ev, err := ParseEnvelope(body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = ' '
	}
	if string(ev.Data) != `{"a":1}` {
		t.Fatalf("Data = %q after the body was overwritten; want its own copy", ev.Data)
	}
}

// manyKeys returns n members "k0":0 … for an object's body.
func manyKeys(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":0`, i)
	}
	return b.String()
}

// Numbers a float64 holds are taken however they are written, underflow
// (read as 0) included; only those past its range are refused.
func TestParseEnvelopeNumbersInRange(t *testing.T) {
	for _, n := range []string{"0", "-0", "1e308", "-1.7976931348623157e308", "1e-999", "12345678901234567890", "2.5E+10", "0e99999", "0.000e999", "-0.0e-5", "1e-99999", "0.001e310"} {
		body := `{"event_id":"evt_1","event":"payment.succeeded","data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z","amount":` + n + `,"list":[` + n + `]}}`
		if _, err := ParseEnvelope([]byte(body)); err != nil {
			t.Errorf("amount %s: %v", n, err)
		}
	}
}

// The format characters that words and emoji need are taken in ids: the
// zero-width non-joiner (Persian), the joiner (an emoji sequence), the
// soft hyphen, a flag's tag characters; the ones that hide or reorder
// text are refused (TestParseEnvelopeRejects).
func TestParseEnvelopeAcceptsFormatCharactersOfText(t *testing.T) {
	for _, id := range []string{"می‌خواهم", "pay_👨‍💻", "soft­hyphen", "flag_🏴󠁧󠁢󠁳󠁣󠁴󠁿"} {
		body, _ := json.Marshal(map[string]any{"event_id": "evt_" + id, "event": "payment.succeeded",
			"data": map[string]any{"id": id, "updated_at": "2026-03-01T12:00:00Z"}})
		if ev, err := ParseEnvelope(body); err != nil || ev.ObjectID != id {
			t.Errorf("id %q: %+v, %v", id, ev, err)
		}
	}
}
