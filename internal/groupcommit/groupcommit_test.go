package groupcommit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/internal/groupcommit"
)

// start runs w until the test ends.
func start[T, R any](t *testing.T, w *groupcommit.Writer[T, R]) {
	t.Helper()
	go w.Run(context.Background())
	t.Cleanup(func() {
		if err := w.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

func TestGathersWhileCommitting(t *testing.T) {
	const n = 20
	release := make(chan struct{})
	entered := make(chan struct{}, n)
	var mu sync.Mutex
	var sizes []int
	w := groupcommit.New(func(_ context.Context, items []int) ([]string, error) {
		entered <- struct{}{}
		<-release
		out := make([]string, len(items))
		for i, it := range items {
			out[i] = fmt.Sprint(it * 10)
		}
		return out, nil
	}, groupcommit.Options{Observe: func(size int, _ time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, size)
	}})
	start(t, w)

	results := make(chan error, n)
	submit := func(i int) {
		got, err := w.Submit(context.Background(), i)
		if err == nil && got != fmt.Sprint(i*10) {
			err = fmt.Errorf("Submit(%d) = %q, want %q", i, got, fmt.Sprint(i*10))
		}
		results <- err
	}
	// The first item's commit holds; the others queue up behind it.
	go submit(0)
	<-entered
	for i := 1; i < n; i++ {
		go submit(i)
	}
	waitQueued(t, w, n-1)
	close(release)
	for range n {
		if err := <-results; err != nil {
			t.Error(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 2 || sizes[0] != 1 || sizes[1] != n-1 {
		t.Errorf("commit sizes = %v, want [1 %d]", sizes, n-1)
	}
}

func TestMaxBatch(t *testing.T) {
	const n = 13 // 12 queue up: the queue holds 4 × MaxBatch
	release := make(chan struct{})
	entered := make(chan struct{}, n)
	var mu sync.Mutex
	var sizes []int
	w := groupcommit.New(func(_ context.Context, items []int) ([]int, error) {
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		entered <- struct{}{}
		<-release
		return items, nil
	}, groupcommit.Options{MaxBatch: 3})
	start(t, w)
	var wg sync.WaitGroup
	submit := func(i int) {
		wg.Go(func() {
			if got, err := w.Submit(context.Background(), i); err != nil || got != i {
				t.Errorf("Submit(%d) = %d, %v", i, got, err)
			}
		})
	}
	// The first commit holds while the other items queue up behind it.
	submit(0)
	<-entered
	for i := 1; i < n; i++ {
		submit(i)
	}
	waitQueued(t, w, n-1)
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	want := []int{1}
	for range (n - 1) / 3 {
		want = append(want, 3)
	}
	if fmt.Sprint(sizes) != fmt.Sprint(want) {
		t.Errorf("commit sizes = %v, want %v", sizes, want)
	}
}

// waitQueued waits until n items wait for a commit, polling with a
// deadline.
func waitQueued[T, R any](t *testing.T, w *groupcommit.Writer[T, R], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for groupcommit.Queued(w) < n {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d queued items (%d)", n, groupcommit.Queued(w))
		}
		time.Sleep(time.Millisecond)
	}
}

var errBad = errors.New("bad item")

func TestFailedBatchRetriedItemByItem(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	first := true
	w := groupcommit.New(func(_ context.Context, items []int) ([]int, error) {
		if first {
			first = false
			entered <- struct{}{}
			<-release
		}
		for _, it := range items {
			if it < 0 {
				return nil, errBad
			}
		}
		return items, nil
	}, groupcommit.Options{})
	start(t, w)
	held := make(chan error, 1)
	go func() { _, err := w.Submit(context.Background(), 0); held <- err }()
	<-entered
	type answer struct {
		item, got int
		err       error
	}
	answers := make(chan answer, 5)
	for _, it := range []int{1, -2, 3, -4, 5} {
		go func() {
			got, err := w.Submit(context.Background(), it)
			answers <- answer{it, got, err}
		}()
	}
	waitQueued(t, w, 5)
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	for range 5 {
		a := <-answers
		switch {
		case a.item < 0 && !errors.Is(a.err, errBad):
			t.Errorf("Submit(%d) err = %v, want errBad", a.item, a.err)
		case a.item >= 0 && (a.err != nil || a.got != a.item):
			t.Errorf("Submit(%d) = %d, %v; want it committed", a.item, a.got, a.err)
		}
	}
}

func TestResultCountMismatchFails(t *testing.T) {
	w := groupcommit.New(func(context.Context, []int) ([]int, error) { return nil, nil }, groupcommit.Options{})
	start(t, w)
	if _, err := w.Submit(context.Background(), 1); err == nil {
		t.Error("Submit succeeded though the commit returned no result")
	}
}

func TestCloseCommitsQueuedThenRefuses(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 3)
	var mu sync.Mutex
	var committed []int
	w := groupcommit.New(func(_ context.Context, items []int) ([]int, error) {
		entered <- struct{}{}
		<-release
		mu.Lock()
		committed = append(committed, items...)
		mu.Unlock()
		return items, nil
	}, groupcommit.Options{})
	go w.Run(context.Background())
	errs := make(chan error, 3)
	submit := func(i int) { _, err := w.Submit(context.Background(), i); errs <- err }
	go submit(0)
	<-entered // item 0's commit holds
	go submit(1)
	go submit(2)
	waitQueued(t, w, 2)
	closed := make(chan error, 1)
	go func() { closed <- w.Close(context.Background()) }()
	// Close waits for the queued items.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with a held commit = %v, want DeadlineExceeded", err)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if len(committed) != 3 {
		t.Errorf("committed %v, want all 3", committed)
	}
	if _, err := w.Submit(context.Background(), 9); !errors.Is(err, groupcommit.ErrClosed) {
		t.Errorf("Submit after Close = %v, want ErrClosed", err)
	}
}

func TestSubmitCancelled(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	w := groupcommit.New(func(_ context.Context, items []int) ([]int, error) {
		<-release
		return items, nil
	}, groupcommit.Options{})
	start(t, w)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := w.Submit(ctx, 1); done <- err }()
	waitQueued(t, w, 0) // let it reach the commit
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Submit = %v, want context.Canceled", err)
	}
}

// lingerWriter returns a started writer with Linger linger whose commits
// record their sizes, and which has committed a batch of one and then a
// batch of three, so that its next batch of fewer than three lingers. Each
// time a batch starts to linger, the writer sends on lingered and then
// waits to receive from gate before its wait begins.
func lingerWriter(t *testing.T, linger time.Duration, gate chan struct{}) (w *groupcommit.Writer[int, int], sizes func() []int, lingered chan struct{}) {
	t.Helper()
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	var mu sync.Mutex
	var got []int
	first := true
	w = groupcommit.New(func(_ context.Context, items []int) ([]int, error) {
		mu.Lock()
		got = append(got, len(items))
		wait := first
		first = false
		mu.Unlock()
		if wait {
			entered <- struct{}{}
			<-release
		}
		return items, nil
	}, groupcommit.Options{Linger: linger})
	lingered = make(chan struct{}, 8)
	groupcommit.OnLinger(w, func() {
		lingered <- struct{}{}
		<-gate
	})
	start(t, w)

	results := make(chan error, 4)
	submit := func(i int) {
		_, err := w.Submit(context.Background(), i)
		results <- err
	}
	go submit(0)
	<-entered
	for i := 1; i <= 3; i++ {
		go submit(i)
	}
	waitQueued(t, w, 3)
	close(release)
	for range 4 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	sizes = func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	if s := sizes(); !slices.Equal(s, []int{1, 3}) {
		t.Fatalf("commit sizes before the test = %v, want [1 3]", s)
	}
	select {
	case <-lingered:
		t.Fatal("a batch lingered after a smaller one")
	default:
	}
	return w, sizes, lingered
}

// opened is a gate that never holds the writer.
func opened() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// waitLinger waits until the writer's next batch lingers.
func waitLinger(t *testing.T, lingered chan struct{}) {
	t.Helper()
	select {
	case <-lingered:
	case <-time.After(5 * time.Second):
		t.Fatal("the batch did not linger")
	}
}

// A batch smaller than the one before waits, and takes the items
// submitted meanwhile into the same commit: the three callers the last
// commit answered share one commit again.
func TestLingerGathersTheItemsSubmittedMeanwhile(t *testing.T) {
	gate := make(chan struct{})
	w, sizes, lingered := lingerWriter(t, time.Millisecond, gate)
	results := make(chan error, 3)
	submit := func(i int) {
		got, err := w.Submit(context.Background(), i)
		if err == nil && got != i {
			err = fmt.Errorf("Submit(%d) = %d", i, got)
		}
		results <- err
	}
	go submit(4)
	waitLinger(t, lingered)
	go submit(5)
	go submit(6)
	waitQueued(t, w, 2)
	close(gate)
	for range 3 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if s := sizes(); !slices.Equal(s, []int{1, 3, 3}) {
		t.Errorf("commit sizes = %v, want [1 3 3]", s)
	}
}

// A lingering batch is committed once Linger has passed, with what it has.
func TestLingerLastsLinger(t *testing.T) {
	const linger = 30 * time.Millisecond
	w, sizes, lingered := lingerWriter(t, linger, opened())
	begin := time.Now()
	if _, err := w.Submit(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	took := time.Since(begin)
	waitLinger(t, lingered)
	if took < linger {
		t.Errorf("Submit returned after %v, before the linger of %v ended", took, linger)
	}
	if s := sizes(); !slices.Equal(s, []int{1, 3, 1}) {
		t.Errorf("commit sizes = %v, want [1 3 1]", s)
	}
}

// One caller at a time never waits: a batch lingers only after a larger one.
func TestLingerNeverDelaysALoneCaller(t *testing.T) {
	var sizes []int
	w := groupcommit.New(func(_ context.Context, items []int) ([]int, error) {
		sizes = append(sizes, len(items))
		return items, nil
	}, groupcommit.Options{Linger: time.Hour})
	groupcommit.OnLinger(w, func() { t.Error("a batch lingered after one no larger") })
	start(t, w)
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := w.Submit(ctx, i)
		cancel()
		if err != nil {
			t.Fatalf("Submit(%d): %v", i, err)
		}
	}
	if !slices.Equal(sizes, []int{1, 1, 1, 1, 1}) {
		t.Errorf("commit sizes = %v, want five of 1", sizes)
	}
}

// Close ends a linger at once: the batch is committed and its caller
// answered, and Close returns.
func TestCloseEndsALinger(t *testing.T) {
	w, sizes, lingered := lingerWriter(t, time.Hour, opened())
	done := make(chan error, 1)
	go func() {
		_, err := w.Submit(context.Background(), 4)
		done <- err
	}()
	waitLinger(t, lingered)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if s := sizes(); !slices.Equal(s, []int{1, 3, 1}) {
		t.Errorf("commit sizes = %v, want [1 3 1]", s)
	}
}

var errWhole = errors.New("the store cannot commit at all")

// An error Whole names fails every item of the batch at once: committed
// again one by one, each would wait as long again (a lock held elsewhere
// made the k-th webhook of a batch wait k busy timeouts).
func TestWholeBatchErrorIsNotRetriedItemByItem(t *testing.T) {
	errs, calls := wholeErrorRun(t, true)
	failed := 0
	for _, err := range errs {
		switch {
		case errors.Is(err, errWhole):
			failed++
		case err != nil:
			t.Errorf("Submit: %v", err)
		}
	}
	if failed != 3 {
		t.Errorf("%d Submits got the batch's error, want 3 (the first item's commit succeeded)", failed)
	}
	if calls != 2 {
		t.Errorf("%d commits, want 2 (the batch of three failed once, not retried item by item)", calls)
	}
}

// wholeErrorRun submits item 0, and items 1 to 3 while its commit runs;
// that commit succeeds when firstOK, every other fails with errWhole (a
// Whole error). It returns the four Submits' errors and the commits made.
func wholeErrorRun(t *testing.T, firstOK bool) (errs []error, calls int) {
	t.Helper()
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	var mu sync.Mutex
	w := groupcommit.New(func(_ context.Context, items []int) ([]int, error) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if !first {
			return nil, errWhole
		}
		entered <- struct{}{}
		<-release
		if firstOK {
			return items, nil
		}
		return nil, errWhole
	}, groupcommit.Options{Whole: func(err error) bool { return errors.Is(err, errWhole) }})
	start(t, w)
	results := make(chan error, 4)
	submit := func(i int) {
		_, err := w.Submit(context.Background(), i)
		results <- err
	}
	go submit(0)
	<-entered
	for i := 1; i <= 3; i++ {
		go submit(i)
	}
	waitQueued(t, w, 3)
	close(release)
	for range 4 {
		errs = append(errs, <-results)
	}
	mu.Lock()
	defer mu.Unlock()
	return errs, calls
}

// The items queued while a commit failed with a Whole error fail with it,
// not in a commit of their own: a commit waiting the busy timeout behind a
// lock held elsewhere made a webhook queued behind it wait that long again
// (20 s for a 503 that senders with a 10 s timeout never saw).
func TestWholeErrorFailsTheItemsQueuedMeanwhile(t *testing.T) {
	errs, calls := wholeErrorRun(t, false)
	for _, err := range errs {
		if !errors.Is(err, errWhole) {
			t.Errorf("Submit: %v, want the failed commit's error", err)
		}
	}
	if calls != 1 {
		t.Errorf("%d commits, want 1 (those queued meanwhile failed with it)", calls)
	}
}
