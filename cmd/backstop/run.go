package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdsync "sync"
	"text/tabwriter"
	"time"

	"github.com/backstop-sync/backstop"
	bsync "github.com/backstop-sync/backstop/sync"
)

// runFunc runs one operation over one resource.
type runFunc func(ctx context.Context, r backstop.Resource) (backstop.RunStats, error)

// runResources runs fn over every resource at once (they share the one
// governor, so running them together costs no extra quota), reporting
// progress, and returns the stats in resource order and the first error.
func runResources(ctx context.Context, resources []backstop.Resource, prog *progress, fn runFunc) ([]backstop.RunStats, error) {
	return eachResource(ctx, resources, func(ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
		st, err := fn(ctx, r)
		err = stoppedByRefusedKey(ctx, err)
		st.Resource, st.Err = r, err
		prog.finish(st)
		return st, err
	})
}

// eachResource runs fn over every resource concurrently and returns the
// results in resource order and the first error that is not a cancellation
// (or the cancellation when nothing else failed). A resource refused for
// the API key (401) stops the others at once (they share the key, and
// every request more is another 401 that can get it locked); their
// errors then say so (stoppedByRefusedKey).
func eachResource[T any](ctx context.Context, resources []backstop.Resource, fn func(context.Context, backstop.Resource) (T, error)) ([]T, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	out := make([]T, len(resources))
	errs := make([]error, len(resources))
	var wg stdsync.WaitGroup
	for i, r := range resources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = fn(ctx, r)
			if errors.Is(errs[i], backstop.ErrUnauthorized) {
				cancel(errs[i])
			}
			errs[i] = stoppedByRefusedKey(ctx, errs[i])
		}()
	}
	wg.Wait()
	return out, resourceErrors(errs)
}

// resourceErrors is what a run over resources failed with: every error
// that is not a cancellation, joined in resource order (so that each
// resource's reason is printed, not only the first's), leaving out the
// resources a refused key stopped when the refusal is among them; or the
// cancellation when nothing else failed; nil when nothing did.
func resourceErrors(errs []error) error {
	var failed []error
	refused := false
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, errStoppedByKey) {
			failed = append(failed, err)
			refused = refused || errors.Is(err, backstop.ErrUnauthorized)
		}
	}
	for _, err := range errs {
		if errors.Is(err, errStoppedByKey) && !refused {
			failed = append(failed, err)
		}
	}
	if len(failed) == 0 {
		return firstError(errs...)
	}
	return errors.Join(failed...)
}

// errStoppedByKey marks the error of a resource stoppedByRefusedKey stopped.
var errStoppedByKey = bsync.ErrStoppedByKey

// stoppedByRefusedKey is bsync.StoppedByRefusedKey: eachResource cancels
// the resources' context with the first refusal of the key as its cause.
func stoppedByRefusedKey(ctx context.Context, err error) error {
	return bsync.StoppedByRefusedKey(ctx, err)
}

// printStats writes the per-resource summary as a table or as JSON. emits,
// for a run that emits, adds what each resource emitted and what the dedup
// suppressed.
func printStats(w io.Writer, op string, stats []backstop.RunStats, emits map[backstop.Resource]bsync.EmitStats, asJSON bool) error {
	if asJSON {
		type row struct {
			Resource      string  `json:"resource"`
			Pages         int     `json:"pages"`
			Objects       int     `json:"objects"`
			New           int     `json:"new"`
			Updated       int     `json:"updated"`
			Emitted       *int    `json:"emitted,omitempty"`
			Suppressed    *int    `json:"suppressed,omitempty"`
			Requests      int     `json:"requests"`
			RateLimited   int     `json:"rate_limited"`
			ThrottleWaitS float64 `json:"throttle_wait_seconds"`
			DurationS     float64 `json:"duration_seconds"`
			Result        string  `json:"result"`
			Error         string  `json:"error,omitempty"`
		}
		out := struct {
			Op        string `json:"op"`
			Resources []row  `json:"resources"`
		}{Op: op}
		for _, s := range stats {
			r := row{
				Resource: string(s.Resource), Pages: s.Pages, Objects: s.Objects, New: s.New,
				Updated: s.Updated, Requests: s.Requests, RateLimited: s.RateLimited,
				ThrottleWaitS: s.ThrottleWait.Seconds(), DurationS: s.Duration.Seconds(),
				Result: feedResult(s),
			}
			if s.Err != nil {
				r.Error = s.Err.Error()
			}
			if emits != nil {
				em := emits[s.Resource]
				r.Emitted, r.Suppressed = &em.Emitted, &em.Suppressed
			}
			out.Resources = append(out.Resources, r)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	emitted := ""
	if emits != nil {
		emitted = "EMITTED\tSUPPRESSED\t"
	}
	fmt.Fprintln(tw, "RESOURCE\tPAGES\tOBJECTS\tNEW\tUPDATED\t"+emitted+"REQUESTS\t429s\tTHROTTLE WAIT\tDURATION\tRESULT\t")
	for _, s := range stats {
		if emits != nil {
			em := emits[s.Resource]
			emitted = fmt.Sprintf("%d\t%d\t", em.Emitted, em.Suppressed)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s%d\t%d\t%s\t%s\t%s\t\n", s.Resource, s.Pages, s.Objects, s.New,
			s.Updated, emitted, s.Requests, s.RateLimited, round(s.ThrottleWait), round(s.Duration), feedResult(s))
	}
	return tw.Flush()
}

// feedResult is a sync or backfill run's outcome as the summary shows it.
func feedResult(s backstop.RunStats) string {
	if s.Err == nil && s.AlreadyDone {
		return "already_done" // a finished backfill; --restart reads it again
	}
	return result(s.Err)
}

// result is the outcome of a run that ended with err.
func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case isCanceled(err):
		return "interrupted"
	}
	return "failed"
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
