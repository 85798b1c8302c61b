package store

import (
	"context"
	"strings"
	"testing"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/jsonvalid"
)

// typedDocs are documents whose members a and b exercise what
// json_extract does with each kind of JSON value.
var typedDocs = []string{
	`{"a":"plain","b":"plain"}`,
	`{"a":"","b":""}`,
	`{"a":"esc \" \\ \/ \b \f \n \r \t","b":"x"}`,
	`{"a":"\u00fc\u20ac\ud83d\ude00","b":"\u0041"}`,
	`{"a":"lone \ud800 high","b":"lone \udc00 low"}`,
	`{"a":"\ud800\u0041","b":"\ud800"}`,
	`{"a":"nul \u0000 byte","b":"\u0000"}`,
	"{\"a\":\"raw \xff\xfe bytes\",\"b\":\"\xc3\"}",
	`{"a":0,"b":0}`,
	`{"a":-0,"b":-0}`,
	`{"a":5,"b":-5}`,
	`{"a":1.0,"b":1.0}`,
	`{"a":1.5,"b":1.5}`,
	`{"a":1e3,"b":1E-3}`,
	`{"a":-0.0,"b":-0.0}`,
	`{"a":0.1,"b":3.141592653589793238462643}`,
	`{"a":9223372036854775807,"b":9223372036854775807}`,
	`{"a":9223372036854775808,"b":9223372036854775808}`,
	`{"a":-9223372036854775808,"b":-9223372036854775808}`,
	`{"a":-9223372036854775809,"b":-9223372036854775809}`,
	`{"a":12345678901234567890123,"b":1e400}`,
	`{"a":-1e400,"b":2.5e-400}`,
	`{"a":700173372036854775808,"b":700173372036854775808}`,
	`{"a":0.30000000000000004,"b":123456789.987654321e-5}`,
	`{"a":1250,"b":1250}`,
	`{"a":true,"b":false}`,
	`{"a":null,"b":null}`,
	`{"a":"12","b":"12"}`,
	`{"a":"12.5","b":"12.5"}`,
	`{"a":" 12 ","b":"0x10"}`,
	`{"a":"1e3","b":"abc"}`,
	`{"a": { "x" : [ 1, 2 , {"y":"a b"} ] } ,"b":[ ]}`,
	`{"a":{},"b":[true, false, null, "s \" ]}"]}`,
	`{"b":1}`,
	`{}`,
	`{"a":1,"a":2,"b":3,"b":4}`,
	`{"a":null,"a":"second","b":{"a":"nested"}}`,
	`{"\u0061":"escaped key","b":"x"}`,
	`{"a\u0000":"not a","b":"x","a":"real"}`,
	`{"a\u0000b":"a NUL b","b\u0000\u0000":"b NUL NUL","a":"real","b":"real"}`,
	`{"\u0000a":"NUL a","a":"real","b":"x"}`,
	// SQLite reads the bytes of a name with escapes as UTF-8 without
	// checking it: an overlong 'a', a zero in two bytes, a lead byte with
	// more continuation bytes than it announces.
	"{\"\xc1\xa1\\u0000\":\"overlong a\",\"b\xc0\x80\\n\":\"b then an overlong NUL\",\"a\":1,\"b\":2}",
	"{\"\xc1\xa1\xa1\\n\":\"three\",\"\xe1\\u0000\":\"lead alone\",\"a\":1,\"b\":2}",
	"{\"\xff\\u0061\":\"ff\",\"\x80b\\n\":\"continuation\",\"a\":1,\"b\":2}",
	` { "a" : "spaced" , "b" : 7 } `,
	"{\n\t\"a\"\r\n:\n\"newlines\",\n\"b\":\n8\n}",
	`["a","b"]`,
	`"a"`,
	`42`,
	`null`,
	`{"c":"other","a":"after","d":{"a":"deep"},"b":"last"}`,
}

// checkTyped stores data through typedValues in columns a (TEXT) and b
// (INTEGER) and through generated columns json_extract(data, '$.a') and
// '$.b' of the same declared types, as the mirror had them before
// migration 0022, and fails the test where the two differ in type or
// value.
func checkTyped(t *testing.T, db *DB, data []byte) {
	t.Helper()
	ctx := context.Background()
	vals := typedValues(nil, data, []string{"a", "b"})
	if err := resolveNumbers(ctx, db.w, vals); err != nil {
		t.Fatal(err)
	}
	if _, err := db.w.ExecContext(ctx, `DELETE FROM typed_plain`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.w.ExecContext(ctx, `DELETE FROM typed_generated`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.w.ExecContext(ctx, `INSERT INTO typed_generated (data) VALUES (?)`, string(data)); err != nil {
		t.Fatalf("%q: json_extract: %v", data, err)
	}
	if _, err := db.w.ExecContext(ctx, `INSERT INTO typed_plain (a, b) VALUES (?, ?)`, vals...); err != nil {
		t.Fatal(err)
	}
	var got, want string
	const q = `SELECT typeof(a) || ' ' || coalesce(hex(a), 'NULL') || ' ' || quote(a) || ' | ' ||
		typeof(b) || ' ' || coalesce(hex(b), 'NULL') || ' ' || quote(b) FROM `
	if err := db.w.GetContext(ctx, &got, q+`typed_plain`); err != nil {
		t.Fatal(err)
	}
	if err := db.w.GetContext(ctx, &want, q+`typed_generated`); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("%q:\n got  %s (from %#v)\n want %s (json_extract)", data, got, vals, want)
	}
}

// openTyped is a store with the two tables checkTyped compares.
func openTyped(t testing.TB) *DB {
	t.Helper()
	db, _ := openTest(t)
	for _, q := range []string{
		`CREATE TABLE typed_plain (a TEXT, b INTEGER)`,
		`CREATE TABLE typed_generated (data TEXT NOT NULL,
			a TEXT GENERATED ALWAYS AS (json_extract(data, '$.a')) VIRTUAL,
			b INTEGER GENERATED ALWAYS AS (json_extract(data, '$.b')) VIRTUAL)`,
	} {
		if _, err := db.w.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

func TestTypedValuesAsJSONExtract(t *testing.T) {
	db := openTyped(t)
	for _, doc := range typedDocs {
		if !jsonvalid.Valid([]byte(doc)) {
			t.Fatalf("test document %q is not valid JSON", doc)
		}
		checkTyped(t, db, []byte(doc))
	}
}

// FuzzTypedValues holds typedValues to json_extract's answers, column
// affinity included, for any valid JSON document.
func FuzzTypedValues(f *testing.F) {
	for _, doc := range typedDocs {
		f.Add([]byte(doc))
	}
	db := openTyped(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if !jsonvalid.Valid(data) {
			return
		}
		checkTyped(t, db, data)
	})
}

// An object nested deeper than SQLite's JSON functions read (1,000 levels)
// is refused, as its write was while the typed columns were generated,
// with a message that says so; one at the limit is mirrored.
func TestMirrorRefusesDataSQLiteCannotRead(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	nested := func(levels int) []byte {
		return []byte(`{"id":"pay_deep","updated_at":"2024-05-01T10:00:00Z","x":` +
			strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`)
	}
	deep := backstop.Object{Resource: backstop.Payments, ID: "pay_deep", UpdatedAt: t0, Data: nested(1001)}
	cur := backstop.Cursor{Resource: backstop.Payments, Kind: backstop.CursorSync}
	if _, err := db.ApplyPage(ctx, []backstop.Object{deep}, cur); err == nil || !strings.Contains(err.Error(), "deeper than 1000 levels") {
		t.Errorf("ApplyPage of 1,001 levels: %v, want it refused for its depth", err)
	}
	ev := backstop.Event{ID: "evt_deep", Type: "payment.succeeded", Resource: backstop.Payments, ObjectID: "pay_deep",
		UpdatedAt: t0, CreatedAt: t0, Origin: backstop.OriginSync, Data: nested(1001)}
	if _, err := db.Emit(ctx, []backstop.Event{ev}, testRoutes); err == nil || !strings.Contains(err.Error(), "event 1 of 1 (evt_deep)") ||
		!strings.Contains(err.Error(), "deeper than 1000 levels") {
		t.Errorf("Emit of 1,001 levels: %v, want it refused naming the event and its depth", err)
	}
	if n := countProcessed(t, db); n != 0 {
		t.Errorf("%d events stored, want none", n)
	}
	deep.Data = nested(1000)
	if _, err := db.ApplyPage(ctx, []backstop.Object{deep}, cur); err != nil {
		t.Fatalf("ApplyPage of 1,000 levels: %v", err)
	}
	var n int
	if err := db.r.GetContext(ctx, &n, `SELECT json_array_length(data, '$.x') FROM payments WHERE id = 'pay_deep'`); err != nil || n != 1 {
		t.Errorf("json_array_length of the mirrored object = %d, %v; want 1", n, err)
	}
}
