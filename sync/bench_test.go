package sync_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	stdsync "sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// BenchmarkMirrorIngest measures a backfill from a local simulator with its
// limits off (the whole path: HTTP, JSON, governor, version-checked upserts
// and cursor commits) against the ceiling of a raw batched INSERT of the
// same objects into the same tables, both in this run.
func BenchmarkMirrorIngest(b *testing.B) {
	const perResource = 10000
	s := sim.New(sim.Options{Seed: 42, Objects: perResource})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx := context.Background()
	total := perResource * len(backstop.Resources)

	var ingest, ceiling time.Duration
	for i := 0; i < b.N; i++ {
		// Ceiling: the same objects, plain multi-row INSERTs of 200.
		db, err := store.Open(ctx, filepath.Join(b.TempDir(), fmt.Sprintf("raw%d.db", i)), store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		var batches [][]backstop.Object
		for _, r := range backstop.Resources {
			objs := s.Objects(r)
			for len(objs) > 0 {
				n := min(200, len(objs))
				batches = append(batches, objs[:n])
				objs = objs[n:]
			}
		}
		start := time.Now()
		for _, batch := range batches {
			if err := db.InsertBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		ceiling += time.Since(start)
		db.Close()

		// The real path: backfill of all four resources at once.
		db, err = store.Open(ctx, filepath.Join(b.TempDir(), fmt.Sprintf("mirror%d.db", i)), store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		client, err := sources.New(sources.Options{
			BaseURL: srv.URL, APIKey: s.APIKey(), PageSize: 200,
			Governor: governor.New(s.APIKey(), governor.Options{Limit: 1 << 30}),
		})
		if err != nil {
			b.Fatal(err)
		}
		eng := &bsync.Engine{Source: client, Mirror: db, PageSize: 200}
		start = time.Now()
		var wg stdsync.WaitGroup
		errs := make(chan error, len(backstop.Resources))
		for _, r := range backstop.Resources {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := eng.Backfill(ctx, r, false)
				if err == nil && st.Objects != perResource {
					err = fmt.Errorf("%s: backfilled %d objects, want %d", r, st.Objects, perResource)
				}
				errs <- err
			}()
		}
		wg.Wait()
		ingest += time.Since(start)
		close(errs)
		for err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		db.Close()
	}
	objPerS := float64(total*b.N) / ingest.Seconds()
	ceilPerS := float64(total*b.N) / ceiling.Seconds()
	b.ReportMetric(objPerS, "objects/s")
	b.ReportMetric(ceilPerS, "ceiling-objects/s")
	fmt.Printf("BENCH mirror-ingest objects=%d objects_per_s=%.0f ceiling_per_s=%.0f ratio=%.2f\n",
		total, objPerS, ceilPerS, objPerS/ceilPerS)
}
