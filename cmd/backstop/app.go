package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// app is what a command that touches the platform and the mirror needs,
// built from the configuration. Close releases it.
type app struct {
	cfg    *config.Config
	log    *slog.Logger
	db     *store.DB
	client *sources.Client
	gov    *governor.Governor
	engine *bsync.Engine
}

// loadConfig reads and validates the configuration; its errors exit 2.
func (m *Main) loadConfig(g *globals) (*config.Config, error) {
	data, err := os.ReadFile(g.configPath)
	if err != nil {
		return nil, usagef("read configuration: %v (set --config or BACKSTOP_CONFIG)", err)
	}
	cfg, err := config.Parse(g.configPath, data, m.LookupEnv)
	if err != nil {
		return nil, usageError{err}
	}
	if err := cfg.Validate(); err != nil {
		return nil, usageError{err}
	}
	return cfg, nil
}

// openApp loads the configuration, opens the store and builds the governed
// platform client. logw is where logs go (the progress display when bars
// are drawn).
func (m *Main) openApp(ctx context.Context, g *globals, logw io.Writer) (*app, error) {
	return m.openAppWith(ctx, g, logw, func(c *config.Config) string { return c.Store.Synchronous })
}

// openAppWith is openApp with the SQLite synchronous level chosen from the
// configuration (serve uses intake.synchronous, FULL by default).
func (m *Main) openAppWith(ctx context.Context, g *globals, logw io.Writer, synchronous func(*config.Config) string) (*app, error) {
	log, err := g.newLogger(logw)
	if err != nil {
		return nil, err
	}
	cfg, err := m.loadConfig(g)
	if err != nil {
		return nil, err
	}
	if cfg.Governor.Redis != "" {
		log.Warn("governor.redis is set but the Redis-shared budget is not built yet; pacing is per process")
	}
	db, err := store.Open(ctx, cfg.Store.Path, store.Options{Synchronous: synchronous(cfg)})
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	src := cfg.Source
	window := src.RateLimit.Window.Std()
	gov := governor.New(src.APIKey.Value(), governor.Options{
		Limit:   tariffLimit(src.RateLimit.PerMinute, window),
		Window:  window,
		Reserve: zeroMeansNone(src.RateLimit.Reserve),
		Logger:  log,
	})
	client, err := sources.New(sources.Options{
		BaseURL:  src.BaseURL,
		APIKey:   src.APIKey.Value(),
		PageSize: src.PageSize,
		Governor: gov,
		RetryMax: zeroMeansNone(src.RetryMax),
		Timeout:  src.Timeout.Std(),
		Logger:   log,
	})
	if err != nil {
		db.Close()
		return nil, usageError{fmt.Errorf("source: %w", err)}
	}
	return &app{
		cfg:    cfg,
		log:    log,
		db:     db,
		client: client,
		gov:    gov,
		engine: &bsync.Engine{
			Source:   client,
			Mirror:   db,
			PageSize: src.PageSize,
			Logger:   log.With("component", "engine"),
		},
	}, nil
}

// Close releases the store.
func (a *app) Close() error {
	if a == nil || a.db == nil {
		return nil
	}
	return a.db.Close()
}

// openStore opens only the store, for commands that do not call the platform.
func (m *Main) openStore(ctx context.Context, g *globals) (*store.DB, *config.Config, error) {
	cfg, err := m.loadConfig(g)
	if err != nil {
		return nil, nil, err
	}
	db, err := store.Open(ctx, cfg.Store.Path, store.Options{Synchronous: cfg.Store.Synchronous})
	if err != nil {
		return nil, nil, fmt.Errorf("open store: %w", err)
	}
	return db, cfg, nil
}

// firstError returns the first non-nil error that is not a cancellation, or
// the cancellation when nothing else failed.
func firstError(errs ...error) error {
	var canceled error
	for _, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, context.Canceled):
			if canceled == nil {
				canceled = err
			}
		default:
			return err
		}
	}
	return canceled
}

// tariffLimit converts the configured per-minute tariff into requests per
// rate-limit window: the governor's budget before the first response tells
// it the real one.
func tariffLimit(perMinute int, window time.Duration) int {
	n := int(float64(perMinute) * window.Minutes())
	return max(n, 1)
}

// zeroMeansNone maps a configured count, where 0 means none, to the
// sources and governor options, where 0 means "the default" and a negative
// value means none.
func zeroMeansNone(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// configName is the configuration file as the user named it, for messages.
func (m *Main) configName(g *globals) string { return g.configPath }
