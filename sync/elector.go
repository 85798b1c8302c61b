package sync

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	stdsync "sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Elector decides whether this process runs the scheduled jobs, so that
// several processes with the same jobs run each tick once. The scheduler
// asks it before every scheduled run (gocron's distributed elector); a run
// it refuses is not made and not stored. Runs started by RunJob do not ask.
type Elector interface {
	// IsLeader returns nil when this process may run jobs now, and an error
	// (ErrNotLeader, or why it cannot tell) when it may not.
	IsLeader(ctx context.Context) error
}

// ErrNotLeader: another process holds the jobs lease.
var ErrNotLeader = errors.New("sync: not the jobs leader")

// DefaultLeaseKey is the Redis key of the jobs lease.
const DefaultLeaseKey = "backstop:jobs:leader"

// LeaseOptions configure a RedisLease.
type LeaseOptions struct {
	// Key is the Redis key of the lease (default DefaultLeaseKey).
	Key string
	// TTL is how long the lease lasts without renewal (required): when the
	// leader dies, another process takes over within it. Campaign renews
	// the lease every TTL/3.
	TTL    time.Duration
	Logger *slog.Logger
}

// RedisLease is an Elector holding a lease in Redis: the process whose id
// the key holds is the leader until the key expires. Every process
// campaigns (Campaign) every TTL/3: the leader renews its lease, the
// others take the key when it has expired. So a leader that dies is
// replaced within TTL (plus one campaign interval), and a leader that
// stops in order (Resign) at once.
type RedisLease struct {
	rdb redis.Scripter
	key string
	id  string
	ttl time.Duration
	log *slog.Logger

	mu     stdsync.Mutex
	leader bool
}

var _ Elector = (*RedisLease)(nil)

// NewRedisLease returns the lease of key in the Redis rdb talks to. The
// caller owns rdb.
func NewRedisLease(rdb redis.Scripter, opts LeaseOptions) (*RedisLease, error) {
	if opts.TTL < 3*time.Millisecond {
		return nil, fmt.Errorf("sync: redis lease: ttl %s is too short", opts.TTL)
	}
	if opts.Key == "" {
		opts.Key = DefaultLeaseKey
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &RedisLease{rdb: rdb, key: opts.Key, id: hex.EncodeToString(id[:]), ttl: opts.TTL, log: log}, nil
}

// ID returns this process's id in the lease.
func (l *RedisLease) ID() string { return l.id }

// Leader reports whether this process held the lease at its last attempt.
func (l *RedisLease) Leader() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leader
}

// IsLeader implements Elector: it takes the lease when it is free and
// renews it when it is this process's. It returns ErrNotLeader when
// another process holds it, or the Redis error.
func (l *RedisLease) IsLeader(ctx context.Context) error {
	n, err := acquireScript.Run(ctx, l.rdb, []string{l.key}, l.id, l.ttl.Milliseconds()).Int()
	if err != nil {
		if ctx.Err() == nil {
			l.set(false, err)
		}
		return fmt.Errorf("sync: jobs lease: %w", err)
	}
	l.set(n == 1, nil)
	if n != 1 {
		return ErrNotLeader
	}
	return nil
}

// Campaign asks for the lease every TTL/3 until ctx is done, then resigns.
// Run it for as long as the process may run jobs.
func (l *RedisLease) Campaign(ctx context.Context) {
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for ctx.Err() == nil {
		_ = l.IsLeader(ctx)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := l.Resign(rctx); err != nil {
		l.log.Warn("jobs lease: resign", "err", err)
	}
}

// Resign gives the lease up if this process holds it, so that another
// takes over at its next campaign.
func (l *RedisLease) Resign(ctx context.Context) error {
	if err := releaseScript.Run(ctx, l.rdb, []string{l.key}, l.id).Err(); err != nil {
		return fmt.Errorf("sync: jobs lease: resign: %w", err)
	}
	l.set(false, nil)
	return nil
}

// set records the outcome of an attempt and logs a change of leadership.
func (l *RedisLease) set(leader bool, err error) {
	l.mu.Lock()
	was := l.leader
	l.leader = leader
	l.mu.Unlock()
	switch {
	case leader && !was:
		l.log.Info("jobs lease: this process is the jobs leader", "lease_id", l.id, "ttl", l.ttl)
	case !leader && was && err != nil:
		l.log.Warn("jobs lease: lost (Redis unreachable): jobs paused", "lease_id", l.id, "err", err)
	case !leader && was:
		l.log.Info("jobs lease: no longer the jobs leader", "lease_id", l.id)
	}
}

// acquireScript sets KEYS[1] to ARGV[1] for ARGV[2] ms when it is free or
// already ARGV[1]'s; it returns 1 then, 0 when another id holds it.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
`)

// releaseScript deletes KEYS[1] when ARGV[1] holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)
