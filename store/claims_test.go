package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// openAt opens the store at path, as a process would; the test closes it.
func openAt(t *testing.T, path string) *DB {
	t.Helper()
	db, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// queueOf queues n payments for target, one a second from t0, and returns
// their ids in queue order.
func queueOf(t *testing.T, db *DB, target string, n int) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = enqueue(t, db, target, fmt.Sprintf("p%02d", i+1), "payment.succeeded", t0.Add(time.Duration(i)*time.Second))
	}
	return ids
}

// TestClaimsLeftByADeadProcessEndAtTheNextStart: a process that claimed
// rows and died (SIGKILL: no outcome, no release) leaves them claimed. A
// dispatcher that starts alone on the store ends those claims at once, so
// the rows are due again in their own place in the queue, before the rows
// behind them, instead of after their lease (an hour here) behind every
// row queued meanwhile.
func TestClaimsLeftByADeadProcessEndAtTheNextStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "backstop.db")
	dead := openAt(t, path)
	ids := queueOf(t, dead, "crm", 6)
	now := t0.Add(time.Minute)
	if got := claimIDs(t, dead, "crm", now, 3, time.Hour); !sameIDs(got, ids[:3]) {
		t.Fatalf("claim of the process that dies = %v, want %v", got, ids[:3])
	}
	// A 429 answered the first row: it stays claimed through the pause,
	// in its place.
	record(t, dead, Attempt{DeliveryID: ids[0], Target: "crm", URL: "u", Attempt: 1, StatusCode: 429, At: now},
		Outcome{Status: StatusRetrying, NextAttemptAt: now.Add(time.Hour), Lease: now.Add(time.Hour)})
	if r := mustDelivery(t, dead, ids[0]); !r.NextAttemptAt.Equal(t0) || !r.ClaimedUntil.Equal(now.Add(time.Hour)) || r.Attempts != 1 {
		t.Errorf("row answered 429 = %+v, want due at %v (its place) and claimed until %v", r, t0, now.Add(time.Hour))
	}
	if err := dead.Close(); err != nil { // the OS releases a killed process's locks
		t.Fatal(err)
	}

	db := openAt(t, path)
	defer db.Close()
	// Shown as claimed until the next dispatcher starts.
	if r := mustDelivery(t, db, ids[1]); !r.ClaimedUntil.Equal(now.Add(time.Hour)) {
		t.Errorf("row of the dead claim before the start = %+v, want claimed until %v", r, now.Add(time.Hour))
	}
	later := now.Add(time.Second)
	if got := claimIDs(t, db, "crm", later, 10, time.Minute); !sameIDs(got, ids) {
		t.Errorf("first claim after the restart = %v, want every row in queue order %v", got, ids)
	}
	if r := mustDelivery(t, db, ids[0]); r.Attempts != 1 || r.Status != StatusRetrying || !r.NextAttemptAt.Equal(t0) {
		t.Errorf("row answered 429 after the restart = %+v, want retrying after 1 attempt, due at %v", r, t0)
	}
	// The claims this dispatcher made are its own: a second claim passes
	// over them.
	if got := claimIDs(t, db, "crm", later, 10, time.Minute); len(got) != 0 {
		t.Errorf("second claim = %v, want none", got)
	}
	// A late outcome of the dead process (its lease lost) changes nothing.
	before := mustDelivery(t, db, ids[1])
	record(t, db, Attempt{DeliveryID: ids[1], Target: "crm", URL: "u", Attempt: 1, StatusCode: 200, At: later},
		Outcome{Status: StatusDelivered, Lease: now.Add(time.Hour)})
	if r := mustDelivery(t, db, ids[1]); fmt.Sprint(r) != fmt.Sprint(before) {
		t.Errorf("outcome under the dead lease applied: %+v", r)
	}
}

// TestAnotherDispatchersClaimsAreKept: serves sharing one store (with
// governor.redis) dispatch at once. One that starts while another runs
// must not end that one's claims: its rows are in flight there.
func TestAnotherDispatchersClaimsAreKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "backstop.db")
	first := openAt(t, path)
	defer first.Close()
	ids := queueOf(t, first, "crm", 4)
	now := t0.Add(time.Minute)
	lease := now.Add(time.Hour)
	if got := claimIDs(t, first, "crm", now, 2, time.Hour); !sameIDs(got, ids[:2]) {
		t.Fatalf("first dispatcher's claim = %v", got)
	}
	second := openAt(t, path)
	defer second.Close()
	if got := claimIDs(t, second, "crm", now.Add(time.Second), 10, time.Hour); !sameIDs(got, ids[2:]) {
		t.Errorf("second dispatcher's claim = %v, want only the rows not claimed %v", got, ids[2:])
	}
	// The first one's outcome still applies under its lease.
	record(t, first, Attempt{DeliveryID: ids[0], Target: "crm", URL: "u", Attempt: 1, StatusCode: 200, At: now},
		Outcome{Status: StatusDelivered, Lease: lease})
	if r := mustDelivery(t, first, ids[0]); r.Status != StatusDelivered {
		t.Errorf("first dispatcher's outcome = %+v, want delivered", r)
	}
	// A third one, started while both run, ends no claim either.
	third := openAt(t, path)
	defer third.Close()
	if got := claimIDs(t, third, "crm", now.Add(2*time.Second), 10, time.Hour); len(got) != 0 {
		t.Errorf("third dispatcher's claim = %v, want none", got)
	}
	if r := mustDelivery(t, third, ids[1]); !r.ClaimedUntil.Equal(lease) {
		t.Errorf("row claimed by the first = %+v, want still claimed until %v", r, lease)
	}
}

// TestCommandsDoNotEndClaims: opening the store (as deliveries list, retry
// or redirect do, beside a running serve) ends no claim; only a claim of
// deliveries does, and only alone.
func TestCommandsDoNotEndClaims(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "backstop.db")
	serve := openAt(t, path)
	defer serve.Close()
	ids := queueOf(t, serve, "crm", 2)
	now := time.Now()
	if got := claimIDs(t, serve, "crm", now, 1, time.Hour); !sameIDs(got, ids[:1]) {
		t.Fatalf("claim = %v", got)
	}
	cli := openAt(t, path)
	defer cli.Close()
	if _, err := cli.Deliveries(ctx, DeliveryFilter{}); err != nil {
		t.Fatal(err)
	}
	if err := cli.RetryDelivery(ctx, ids[0], now); !errors.Is(err, backstop.ErrInFlight) {
		t.Errorf("retry of the claimed row = %v, want ErrInFlight", err)
	}
	if r := mustDelivery(t, cli, ids[0]); r.ClaimedUntil.IsZero() || r.Attempts != 0 {
		t.Errorf("claimed row after the commands = %+v, want claimed, no attempt", r)
	}
}

// TestRateLimitedRowKeepsItsPlace: a row a 429 answered stays claimed
// through its target's pause and keeps its place in the queue: it is not
// claimed while its claim lasts, and it is the first claimed once the
// claim is released (the pause outlasted the lease), or once the claim
// ran out (its process died).
func TestRateLimitedRowKeepsItsPlace(t *testing.T) {
	ctx := context.Background()
	for _, ended := range []string{"released", "lease over"} {
		t.Run(ended, func(t *testing.T) {
			db, _ := openTest(t)
			ids := queueOf(t, db, "crm", 3)
			now := t0.Add(time.Minute)
			lease := now.Add(time.Minute)
			if got := claimIDs(t, db, "crm", now, 1, time.Minute); !sameIDs(got, ids[:1]) {
				t.Fatalf("claim = %v", got)
			}
			record(t, db, Attempt{DeliveryID: ids[0], Target: "crm", URL: "u", Attempt: 1, StatusCode: 429, At: now},
				Outcome{Status: StatusRetrying, NextAttemptAt: lease, Lease: lease})
			// Rows queued during the pause go behind it.
			late := enqueue(t, db, "crm", "p_late", "payment.succeeded", now.Add(time.Second))
			if got := claimIDs(t, db, "crm", now.Add(2*time.Second), 1, time.Minute); !sameIDs(got, ids[1:2]) {
				t.Errorf("claim during the pause = %v, want the next row %d", got, ids[1])
			}
			at := lease
			if ended == "released" {
				if n, err := db.Release(ctx, ids[:1], nil, lease, now.Add(3*time.Second)); err != nil || n != 1 {
					t.Fatalf("Release = %d, %v", n, err)
				}
				at = now.Add(3 * time.Second)
			}
			if got := claimIDs(t, db, "crm", at, 10, time.Minute); !sameIDs(got, []int64{ids[0], ids[2], late}) {
				t.Errorf("claim once the claim ended = %v, want [%d %d %d]: the row answered 429 first", got, ids[0], ids[2], late)
			}
			if r := mustDelivery(t, db, ids[0]); r.Attempts != 1 || r.Failures != 0 || !r.NextAttemptAt.Equal(t0) {
				t.Errorf("row answered 429 = %+v, want 1 attempt, no failure, due at %v", r, t0)
			}
		})
	}
}

// TestClaimPassesOverClaimedRowsInTheIndex: a claim's whole condition,
// the claim's end included, is answered by outbox_due, in claim order, so
// the rows a claim passes over (claimed, in flight or held through a
// 429's pause, at the head of the queue) are not read from the table. The
// program of the claim's selection of ids alone reads outbox_due and never
// a column of the table, and sorts nothing (the plan of the claim itself
// is TestClaimReadsTheQueueIndex's).
func TestClaimPassesOverClaimedRowsInTheIndex(t *testing.T) {
	db, _ := openTest(t)
	var roots []struct {
		Name string `db:"name"`
		Root int64  `db:"rootpage"`
	}
	if err := db.r.Select(&roots, `SELECT name, rootpage FROM sqlite_schema WHERE name IN ('outbox', 'outbox_due')`); err != nil || len(roots) != 2 {
		t.Fatalf("root pages: %+v, %v", roots, err)
	}
	root := map[string]int64{}
	for _, r := range roots {
		root[r.Name] = r.Root
	}
	var program []struct {
		Addr   int64   `db:"addr"`
		Opcode string  `db:"opcode"`
		P1     int64   `db:"p1"`
		P2     int64   `db:"p2"`
		P3     int64   `db:"p3"`
		P4     *string `db:"p4"`
		P5     int64   `db:"p5"`
		Note   *string `db:"comment"`
	}
	ids := strings.Replace(claimSelectSQL, outboxColumns, "id", 1)
	if err := db.r.Select(&program, `EXPLAIN `+ids, "crm", "2026", 10); err != nil {
		t.Fatal(err)
	}
	table, index := int64(-1), int64(-1)
	for _, op := range program {
		switch {
		case op.Opcode == "OpenRead" && op.P2 == root["outbox"]:
			table = op.P1
		case op.Opcode == "OpenRead" && op.P2 == root["outbox_due"]:
			index = op.P1
		case op.Opcode == "SorterOpen" || op.Opcode == "OpenEphemeral":
			t.Errorf("the claim's selection sorts (%s)", op.Opcode)
		}
	}
	if index < 0 {
		t.Fatalf("the claim's selection does not read outbox_due: %+v", program)
	}
	for _, op := range program {
		if op.Opcode == "Column" && op.P1 == table {
			t.Errorf("the claim's selection of ids reads column %d of the table at %d: the rows it passes over are read", op.P2, op.Addr)
		}
	}
}
