package sync

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// JobLocker keeps one job from running in two processes at once, whoever
// started it: the scheduler on the leader, `backstop run` from system cron
// on another machine, or the dashboard's Run now. The scheduler takes the
// job's lock before every run.
type JobLocker interface {
	// LockJob takes job's lock. It returns ErrJobRunning (wrapped) when
	// another process holds it. Otherwise the returned context is ctx,
	// cancelled with cause ErrJobLockLost should the lock be lost while
	// the run goes on, and release gives the lock up; it must be called.
	LockJob(ctx context.Context, job string) (context.Context, func(), error)
}

// ErrJobLockLost: the job's lock expired or was taken while it ran (a
// Redis that restarted empty, or a process stalled past the lock's TTL).
var ErrJobLockLost = errors.New("sync: job lock lost")

// DefaultJobLockPrefix starts the Redis keys of the job locks.
const DefaultJobLockPrefix = "backstop:jobs:lock:"

// RedisJobLocks is a JobLocker on Redis: a job's lock is a key holding
// its run's token for TTL, renewed every TTL/3 while the run goes on, so
// a process that dies frees its jobs within TTL.
type RedisJobLocks struct {
	rdb    redis.Scripter
	prefix string
	ttl    time.Duration
	log    *slog.Logger
}

var _ JobLocker = (*RedisJobLocks)(nil)

// NewRedisJobLocks returns the job locks under opts.Key (a key prefix,
// default DefaultJobLockPrefix) in the Redis rdb talks to, lasting
// opts.TTL without renewal. The caller owns rdb.
func NewRedisJobLocks(rdb redis.Scripter, opts LeaseOptions) (*RedisJobLocks, error) {
	opts, err := opts.withDefaults("redis job locks", DefaultJobLockPrefix)
	if err != nil {
		return nil, err
	}
	return &RedisJobLocks{rdb: rdb, prefix: opts.Key, ttl: opts.TTL, log: opts.Logger}, nil
}

// LockJob implements JobLocker.
func (l *RedisJobLocks) LockJob(ctx context.Context, job string) (context.Context, func(), error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	token, key := hex.EncodeToString(b[:]), l.prefix+job
	start := time.Now() // the key lasts until start + ttl at least
	n, err := acquireScript.Run(ctx, l.rdb, []string{key}, token, l.ttl.Milliseconds()).Int()
	if err != nil {
		return nil, nil, fmt.Errorf("sync: lock job %s: %w", job, err)
	}
	if n != 1 {
		// Held at most TTL more unless its holder renews it: a process
		// that died frees it by then.
		return nil, nil, &jobLockedError{job: job, until: time.Now().Add(l.ttl)}
	}
	rctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.renew(rctx, cancel, key, token, start)
	}()
	release := func() {
		cancel(context.Canceled)
		<-done
		uctx, stop := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer stop()
		if err := releaseScript.Run(uctx, l.rdb, []string{key}, token).Err(); err != nil {
			l.log.Warn("job lock: release (it expires by itself)", "job", job, "err", err)
		}
	}
	return rctx, release, nil
}

// renew renews key while ctx lasts, the key being held since held (when
// the acquisition that took it began); it cancels ctx with ErrJobLockLost
// when another token holds the key, or as soon as TTL has passed since
// the start of the last renewal that succeeded (the key may have expired
// and been taken meanwhile): on a timer of its own, so that a renewal
// hanging on a Redis that does not answer does not keep the run going
// past it, and a renewal answered after that does not count.
func (l *RedisJobLocks) renew(ctx context.Context, cancel context.CancelCauseFunc, key, token string, held time.Time) {
	expired := time.AfterFunc(time.Until(held.Add(l.ttl)), func() {
		if ctx.Err() == nil {
			l.log.Warn("job lock: not renewed within its TTL: stopping this run", "key", key, "ttl", l.ttl)
			cancel(ErrJobLockLost)
		}
	})
	defer expired.Stop()
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		n, err := acquireScript.Run(ctx, l.rdb, []string{key}, token, l.ttl.Milliseconds()).Int()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && n == 1:
			if !expired.Stop() {
				return // answered too late: the timer has stopped the run
			}
			expired.Reset(time.Until(start.Add(l.ttl)))
		case err == nil:
			l.log.Warn("job lock: taken by another process: stopping this run", "key", key)
			cancel(ErrJobLockLost)
			return
		default:
			l.log.Debug("job lock: renewal failed (the lock still holds until its TTL)", "key", key, "err", err)
		}
	}
}

// jobLockedError is LockJob's refusal while another process holds the
// job's lock; it wraps ErrJobRunning.
type jobLockedError struct {
	job   string
	until time.Time
}

func (e *jobLockedError) Error() string {
	return fmt.Sprintf("job %s: %v in another process", e.job, ErrJobRunning)
}

func (e *jobLockedError) Unwrap() error { return ErrJobRunning }

// HeldUntil implements heldElsewhere: the lock expires by then unless
// its holder renews it, so the scheduler tries a skipped run again then.
func (e *jobLockedError) HeldUntil() time.Time { return e.until }
