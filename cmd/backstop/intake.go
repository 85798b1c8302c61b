package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
)

// intakeStack is the running webhook intake: the handler, its group-commit
// writer and the truncated-event fetcher. serve and demo both run one.
type intakeStack struct {
	handler    *intake.Handler
	writer     *intake.Batcher
	metrics    *intake.Metrics
	writerDone chan struct{}
	fetchDone  chan struct{}
	stopFetch  context.CancelFunc
	// damaged holds the first commit error that found the store file
	// damaged (store.Damaged): that does not pass, so serve is not ready
	// from then on, even while other commits, on sound pages, succeed.
	damaged atomic.Pointer[error]
}

// intakeOptions are what startIntake's writer is told besides the store.
type intakeOptions struct {
	routes   []backstop.Route
	maxBatch int           // intake.max_batch; 0 means the writer's default
	linger   time.Duration // intake.linger
	// onQueued, when set, is told the targets each commit queued rows for
	// (the dispatcher's Wake).
	onQueued func(target string)
}

// startIntake starts the writer and the fetcher over db; src fetches the
// objects of truncated events. Stop it with stop.
func startIntake(ctx context.Context, db *store.DB, src backstop.Source, v intake.Verifier, opts intakeOptions,
	log *slog.Logger, reg prometheus.Registerer) *intakeStack {
	routes := opts.routes
	metrics := intake.NewMetrics(reg)
	s := &intakeStack{}
	observe := func(size int, took time.Duration, err error) {
		metrics.ObserveCommit(size, took, err)
		if err != nil && store.Damaged(err) && s.damaged.CompareAndSwap(nil, &err) {
			log.Error("the store file is damaged: serve is not ready until it is restarted on a sound store "+
				"(see backstop restore --help)", "error", err)
		}
	}
	writer := intake.NewBatcher(db, intake.BatcherOptions{
		MaxBatch: opts.maxBatch, Linger: opts.linger, Whole: store.LockHeld, Routes: routes, Logger: log.With("component", "emit"), Observe: observe,
		OnQueued: opts.onQueued,
	})
	fetcher := intake.NewFetcher(db, src, intake.FetcherOptions{
		Routes: routes, Metrics: metrics, Logger: log.With("component", "truncated"), OnQueued: opts.onQueued,
	})
	s.writer, s.metrics = writer, metrics
	s.writerDone, s.fetchDone = make(chan struct{}), make(chan struct{})
	s.handler = intake.NewHandler(v, writer, intake.HandlerOptions{
		Metrics: metrics, Logger: log.With("component", "intake"),
		OnTruncated: func(backstop.Event) { fetcher.Wake() },
	})
	// Commits are not cancelled by a signal: they finish, then stop drains.
	go func() {
		defer close(s.writerDone)
		writer.Run(context.WithoutCancel(ctx))
	}()
	var fetchCtx context.Context
	fetchCtx, s.stopFetch = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(s.fetchDone)
		fetcher.Run(fetchCtx)
	}()
	return s
}

// stop answers 503 to new requests, commits what is queued and stops the
// fetcher. Call it after the HTTP server stopped handing requests over.
func (s *intakeStack) stop(ctx context.Context) error {
	s.handler.Drain()
	err := s.writer.Close(ctx)
	if err == nil {
		<-s.writerDone
	}
	s.stopFetch()
	<-s.fetchDone
	if err != nil {
		return fmt.Errorf("finish commits: %w", err)
	}
	return nil
}
