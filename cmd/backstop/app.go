package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop"
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
	// meter counts what the engine's platform calls cost, for the quota
	// samples; the engine's Source is the meter over client.
	meter *quotaMeter

	// With governor.redis: the client, the governor's store that falls
	// back to local pacing, and the jobs lease (made by schedulerWith).
	rdb      *redis.Client
	fallback *governor.FallbackStore
	lease    *bsync.RedisLease
}

// loadConfig reads and validates the configuration; its errors exit 2.
// local is for commands that only use the store (config.ParseLocal).
func (m *Main) loadConfig(g *globals, local bool) (*config.Config, error) {
	data, err := os.ReadFile(g.configPath)
	if err != nil {
		return nil, usagef("read configuration: %v (set --config or BACKSTOP_CONFIG)", err)
	}
	parse := config.Parse
	if local {
		parse = config.ParseLocal
	}
	cfg, err := parse(g.configPath, data, m.LookupEnv)
	if err != nil {
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

// openAppLocal opens what commands that only read (jobs) need: the
// configuration, read as openStore reads it (the platform's address and
// key may be missing), and the store. They make no platform request, so
// they neither need the API key nor wait for Redis, and work while it is
// down; the app's engine has no source.
func (m *Main) openAppLocal(ctx context.Context, g *globals, logw io.Writer) (*app, error) {
	log, err := g.newLogger(logw)
	if err != nil {
		return nil, err
	}
	db, cfg, err := m.openStore(ctx, g)
	if err != nil {
		return nil, err
	}
	return &app{cfg: cfg, db: db, log: log, engine: &bsync.Engine{Mirror: db, Logger: log, Command: g.command}}, nil
}

// openAppWith is openApp with the SQLite synchronous level chosen from the
// configuration (serve uses intake.synchronous, FULL by default).
func (m *Main) openAppWith(ctx context.Context, g *globals, logw io.Writer, synchronous func(*config.Config) string) (*app, error) {
	log, err := g.newLogger(logw)
	if err != nil {
		return nil, err
	}
	cfg, err := m.loadConfig(g, false)
	if err != nil {
		return nil, err
	}
	src := cfg.Source
	var rdb *redis.Client
	var fallback *governor.FallbackStore
	var govStore governor.Store // nil: the process's own MemoryStore
	govLog := log.With("component", "governor")
	if cfg.Governor.Redis != "" {
		if rdb, err = connectRedis(ctx, cfg.Governor.Redis.Value()); err != nil {
			return nil, usageError{err}
		}
		fallback = governor.NewFallbackStore(
			governor.NewRedisStore(rdb, governor.RedisOptions{}),
			governor.FallbackOptions{Share: cfg.Governor.FallbackShare, Logger: govLog},
		)
		govStore = fallback
		log.Info("governor: sharing the rate-limit budget through Redis",
			"redis", backstop.RedactURL(cfg.Governor.Redis.Value()), "fallback_share", cfg.Governor.FallbackShare)
	}
	db, err := openConfiguredStore(ctx, cfg, synchronous(cfg))
	if err != nil {
		if rdb != nil {
			rdb.Close()
		}
		return nil, err
	}
	window := src.RateLimit.Window.Std()
	gov := governor.New(src.APIKey.Value(), governor.Options{
		Limit:   tariffLimit(src.RateLimit.PerMinute, window),
		Window:  window,
		Reserve: zeroMeansNone(src.RateLimit.Reserve),
		Store:   govStore,
		Logger:  govLog,
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
		if rdb != nil {
			rdb.Close()
		}
		return nil, usageError{fmt.Errorf("source: %w", err)}
	}
	meter := &quotaMeter{Source: client}
	return &app{
		cfg:      cfg,
		log:      log,
		db:       db,
		client:   client,
		gov:      gov,
		meter:    meter,
		rdb:      rdb,
		fallback: fallback,
		engine: &bsync.Engine{
			Source:   meter,
			Mirror:   db,
			PageSize: src.PageSize,
			Logger:   log.With("component", "engine"),
			Command:  g.command,
		},
	}, nil
}

// Close releases the store and the Redis client. A run that fell back to
// local pacing says so in its last log line.
func (a *app) Close() error {
	if a == nil || a.db == nil {
		return nil
	}
	if a.fallback != nil {
		a.fallback.Close() // its background probe of Redis, before the client closes
		if st := a.fallback.Stats(); st.Fallbacks > 0 {
			a.log.Warn("governor: this run paced locally while Redis was unreachable",
				"fallbacks", st.Fallbacks, "local_requests", st.LocalGrants)
		}
	}
	a.saveLastQuotaSample()
	err := a.db.Close()
	if a.rdb != nil {
		err = errors.Join(err, a.rdb.Close())
	}
	return err
}

// Timeouts of the Redis client: short, because every platform request
// waits on Redis, and a Redis that does not answer is better replaced by
// local pacing (governor.FallbackStore) than waited for.
const (
	redisDialTimeout = 2 * time.Second
	redisIOTimeout   = time.Second
	redisPingTimeout = 5 * time.Second
)

// quietRedis silences go-redis's own logger (a process-wide setting): what
// matters is reported through slog by the governor and the jobs lease.
var quietRedis sync.Once

// connectRedis opens a client of the Redis at rawURL and checks that it
// answers. Its errors name the server without the password.
func connectRedis(ctx context.Context, rawURL string) (*redis.Client, error) {
	quietRedis.Do(func() { redis.SetLogger(discardRedisLog{}) })
	addr := backstop.RedactURL(rawURL)
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		// The parser's message may quote the URL, password and all.
		return nil, fmt.Errorf("governor.redis %s: want redis://[user:password@]host:port/db", addr)
	}
	opts.DialTimeout = redisDialTimeout
	opts.ReadTimeout, opts.WriteTimeout = redisIOTimeout, redisIOTimeout
	opts.PoolTimeout = redisDialTimeout
	opts.MaxRetries = 1 // a pooled connection that died with a restarted Redis
	// One dial per try: go-redis's default (5 dials, 100 ms apart) held
	// the request that found Redis gone for 0.8 s when refused, and
	// five DialTimeouts when its host did not answer, before the
	// governor could pace locally.
	opts.DialerRetries = 1
	rdb := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, redisPingTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("governor.redis %s: unreachable: %w", addr, err)
	}
	return rdb, nil
}

// discardRedisLog is a go-redis logger that drops everything.
type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// registerMetrics exports the shared governor's state on reg: how often
// Redis was lost and the requests paced locally meanwhile, and whether
// this process leads the jobs. Without governor.redis there is nothing to
// export.
func (a *app) registerMetrics(reg prometheus.Registerer) {
	if a.fallback == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "backstop_governor_fallbacks_total",
			Help: "Times Redis (governor.redis) became unreachable and the governor fell back to local pacing.",
		}, func() float64 { return float64(a.fallback.Stats().Fallbacks) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "backstop_governor_fallback_requests_total",
			Help: "Platform requests granted by local pacing (at governor.fallback_share of the budget) while Redis was unreachable.",
		}, func() float64 { return float64(a.fallback.Stats().LocalGrants) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "backstop_governor_fallback_active",
			Help: "1 while the governor paces locally because Redis is unreachable, else 0.",
		}, func() float64 { return bool01(a.fallback.Stats().Local) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "backstop_jobs_leader",
			Help: "1 while this process holds the jobs lease (governor.job_lease) and runs the scheduled jobs, else 0.",
		}, func() float64 { return bool01(a.lease != nil && a.lease.Leader()) }),
	)
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// openStore opens only the store, for commands that do not call the
// platform: the configuration need not name the platform's address or key.
// For the commands that only read it (globals.readsStore), a store.path
// with no database is a configuration error naming the file, line and
// key, and no file is created.
func (m *Main) openStore(ctx context.Context, g *globals) (*store.DB, *config.Config, error) {
	cfg, err := m.loadConfig(g, true)
	if err != nil {
		return nil, nil, err
	}
	if g.readsStore {
		if err := existingStore(cfg); err != nil {
			return nil, nil, err
		}
	}
	db, err := openConfiguredStore(ctx, cfg, cfg.Store.Synchronous)
	if err != nil {
		return nil, nil, err
	}
	return db, cfg, nil
}

// storeDirProblem is the usage error of a store.path whose directory is
// missing, not a directory, or one this user cannot write to (a read-only
// mount too), naming the file, line and key; nil when there is none.
func storeDirProblem(cfg *config.Config) error {
	if fi, err := os.Stat(cfg.Store.Path); err == nil && fi.IsDir() {
		return usageError{cfg.Problem("store.path", "%s is a directory: name the store's file in it, such as %s", cfg.Store.Path, filepath.Join(cfg.Store.Path, "backstop.db"))}
	}
	dir := filepath.Dir(cfg.Store.Path)
	switch fi, err := os.Stat(dir); {
	case errors.Is(err, fs.ErrNotExist):
		return usageError{cfg.Problem("store.path", "directory %s does not exist: create it, or give a path in an existing directory", dir)}
	case err == nil && !fi.IsDir():
		return usageError{cfg.Problem("store.path", "%s is not a directory", dir)}
	case err == nil && syscall.Access(dir, 2|1) != nil: // W_OK|X_OK; EROFS on a read-only mount
		// SQLite said "attempt to write a readonly database", or, for
		// the open-lock, "unable to open database file".
		return usageError{cfg.Problem("store.path", "this user cannot write to the directory %s: backstop creates the store and its -wal, -shm and lock files there, even to read it", dir)}
	}
	return nil
}

// openConfiguredStore opens the database of store.path. A directory that
// is missing (SQLite creates the file, not its directory) is a
// configuration error naming the file, line and key; the store's own
// errors name the path.
func openConfiguredStore(ctx context.Context, cfg *config.Config, synchronous string) (*store.DB, error) {
	if err := storeDirProblem(cfg); err != nil {
		return nil, err
	}
	db, err := store.Open(ctx, cfg.Store.Path, store.Options{Synchronous: synchronous})
	if errors.Is(err, store.ErrNotStore) {
		// A wrong path (a typo, a shared data directory), not a failure.
		return nil, usageError{cfg.Problem("store.path", "%v", err)}
	}
	if store.Damaged(err) {
		return nil, fmt.Errorf("%w: the store file is damaged; put a backup in its place (backstop restore --help), "+
			"or recover what it holds with sqlite3's .recover", err)
	}
	return db, err
}

// existingStore refuses a store.path where no database exists, for the
// commands that only read it: opening it would create an empty database
// there, and a mistyped path would look like a mirror with nothing in it.
func existingStore(cfg *config.Config) error {
	path := cfg.Store.Path
	if _, err := os.Stat(filepath.Dir(path)); err != nil {
		return nil // openConfiguredStore names the directory
	}
	switch fi, err := os.Stat(path); {
	case errors.Is(err, fs.ErrNotExist):
		return usageError{cfg.Problem("store.path", "no database at %s: run backstop sync or serve first, or check store.path", path)}
	case err != nil:
		return usageError{cfg.Problem("store.path", "%v", err)}
	case fi.Mode().IsRegular() && fi.Size() == 0:
		// SQLite takes an empty file for an empty database and would
		// make a store of it.
		return usageError{cfg.Problem("store.path", "%s is an empty file, not a backstop store: check store.path, or remove the file and run backstop sync or serve", path)}
	}
	return nil
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
