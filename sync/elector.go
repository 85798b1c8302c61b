package sync

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
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

// withDefaults checks opts for what (named in the error) and fills in
// defaultKey and a logger that discards.
func (opts LeaseOptions) withDefaults(what, defaultKey string) (LeaseOptions, error) {
	if opts.TTL < 3*time.Millisecond {
		return opts, fmt.Errorf("sync: %s: ttl %s is too short", what, opts.TTL)
	}
	if opts.Key == "" {
		opts.Key = defaultKey
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return opts, nil
}

// RedisLease is an Elector holding a lease in Redis: the process whose id
// the key holds is the leader until the key expires. Every process
// campaigns (Campaign) every TTL/3: the leader renews its lease, the
// others take the key when it has expired. So a leader that dies is
// replaced within TTL (plus one campaign interval), and a leader that
// stops in order (Resign) at once.
//
// A leader's term (Lost) ends as soon as it finds another process holding
// the key, when it resigns, or when TTL has passed since the start of its
// last successful renewal, which is no later than the key expires in
// Redis: so a process whose renewals fail (Redis unreachable) stops
// counting itself leader before any other process can take the key.
type RedisLease struct {
	rdb redis.Scripter
	key string
	id  string
	ttl time.Duration
	log *slog.Logger

	mu     stdsync.Mutex
	heldBy string        // the other holder last logged (standby), "" when none
	leader bool          // the outcome of the last attempt
	term   chan struct{} // open while this process holds the lease; nil otherwise
	until  time.Time     // when the term ends unless renewed
	expiry *time.Timer   // ends the term at until
}

// Leadership is implemented by electors whose leadership can end in the
// middle of a run (RedisLease): the scheduler cancels its scheduled runs
// when Lost's channel closes, so that they do not go on beside the next
// leader's.
type Leadership interface {
	// Lost returns a channel closed when the current term as leader ends;
	// it is closed already when this process does not lead.
	Lost() <-chan struct{}
}

var _ Leadership = (*RedisLease)(nil)

// ended is the closed channel of no term.
var ended = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

var _ Elector = (*RedisLease)(nil)

// NewRedisLease returns the lease of key in the Redis rdb talks to. The
// caller owns rdb.
func NewRedisLease(rdb redis.Scripter, opts LeaseOptions) (*RedisLease, error) {
	opts, err := opts.withDefaults("redis lease", DefaultLeaseKey)
	if err != nil {
		return nil, err
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	// The host and pid tell an operator which process leads; the random
	// part keeps two leases of one process apart.
	host, _ := os.Hostname()
	lid := fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(id[:]))
	return &RedisLease{rdb: rdb, key: opts.Key, id: lid, ttl: opts.TTL, log: opts.Logger}, nil
}

// ID returns this process's id in the lease: host:pid:random.
func (l *RedisLease) ID() string { return l.id }

// Leader reports whether this process is the jobs leader: it held the
// lease at its last attempt, and its term has not run out since.
func (l *RedisLease) Leader() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leader
}

// Lost implements Leadership: the returned channel is closed when this
// process's current term as leader ends (see RedisLease).
func (l *RedisLease) Lost() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == nil {
		return ended
	}
	return l.term
}

// IsLeader implements Elector: it takes the lease when it is free and
// renews it when it is this process's. It returns ErrNotLeader when
// another process holds it, or the Redis error. A Redis error does not end
// the current term at once: the lease still holds in Redis until TTL
// after its last renewal, and the term ends then unless renewed.
func (l *RedisLease) IsLeader(ctx context.Context) error {
	start := time.Now()
	res, err := leaseScript.Run(ctx, l.rdb, []string{l.key}, l.id, l.ttl.Milliseconds()).Result()
	if err != nil {
		if ctx.Err() == nil {
			l.stepDown(err)
		}
		return fmt.Errorf("sync: jobs lease: %w", err)
	}
	if holder, ok := res.(string); ok {
		l.endTerm()
		l.stepDown(nil)
		l.standby(holder)
		return ErrNotLeader
	}
	if !l.renewed(start) {
		// Answered after the term it renews would have ended (a Redis
		// that hung): the key may have expired and been taken meanwhile,
		// so this answer proves nothing, and it changes nothing either.
		// The term it would have renewed ran out on its own timer; a term
		// a later call renewed in time (gocron asks before each run while
		// Campaign's call hangs) stands.
		return fmt.Errorf("sync: jobs lease: renewal answered after %s, past the lease's %s", time.Since(start).Round(time.Millisecond), l.ttl)
	}
	return nil
}

// standby logs, once per holder rather than at every attempt, that
// another process holds the lease and runs the jobs.
func (l *RedisLease) standby(holder string) {
	l.mu.Lock()
	changed := l.heldBy != holder
	l.heldBy = holder
	l.mu.Unlock()
	if changed {
		l.log.Info("jobs run by another process: lease held by "+holder, "lease_id", l.id, "key", l.key)
	}
}

// renewed extends the term (or starts one) to TTL after start, the time
// the renewal was sent (Redis counts the TTL from a later moment), and
// records this process as the leader. It does neither, and returns false,
// when that time has passed already: the renewal came too late to count.
func (l *RedisLease) renewed(start time.Time) bool {
	l.mu.Lock()
	until := start.Add(l.ttl)
	if !time.Now().Before(until) {
		l.mu.Unlock()
		return false
	}
	if l.term == nil {
		l.term = make(chan struct{})
	}
	// Calls overlap: an older call answered in time after a newer one
	// does not move the end of the term back.
	if l.until.After(until) {
		until = l.until
	}
	l.until = until
	if l.expiry == nil {
		l.expiry = time.AfterFunc(time.Until(l.until), l.expire)
	} else {
		l.expiry.Reset(time.Until(l.until))
	}
	was := l.leader
	l.leader = true
	l.heldBy = "" // a later standby is logged again
	l.mu.Unlock()
	if !was {
		l.log.Info("jobs lease: this process is the jobs leader", "lease_id", l.id, "ttl", l.ttl)
	}
	return true
}

// expire ends the term when it has not been renewed since its timer was
// set (a renewal re-arms the timer).
func (l *RedisLease) expire() {
	l.mu.Lock()
	if l.term == nil || time.Now().Before(l.until) {
		l.mu.Unlock()
		return
	}
	close(l.term)
	l.term = nil
	// No longer the leader (backstop_jobs_leader says so): the next
	// renewal that succeeds starts a new term, and says so.
	l.leader = false
	l.mu.Unlock()
	l.log.Warn("jobs lease: expired without renewal: scheduled runs stopped", "lease_id", l.id)
}

// endTerm ends the current term, if any.
func (l *RedisLease) endTerm() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.expiry != nil {
		l.expiry.Stop()
	}
	if l.term != nil {
		close(l.term)
		l.term = nil
	}
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

// Resign ends this process's term and gives the lease up if this process
// holds it, so that another takes over at its next campaign.
func (l *RedisLease) Resign(ctx context.Context) error {
	l.endTerm()
	if err := releaseScript.Run(ctx, l.rdb, []string{l.key}, l.id).Err(); err != nil {
		return fmt.Errorf("sync: jobs lease: resign: %w", err)
	}
	l.stepDown(nil)
	return nil
}

// stepDown records that an attempt did not make this process the leader
// (err: why it could not tell), and logs a change of leadership.
func (l *RedisLease) stepDown(err error) {
	l.mu.Lock()
	was := l.leader
	l.leader = false
	l.mu.Unlock()
	switch {
	case was && err != nil:
		l.log.Warn("jobs lease: lost (Redis unreachable): jobs paused", "lease_id", l.id, "err", err)
	case was:
		l.log.Info("jobs lease: no longer the jobs leader", "lease_id", l.id)
	}
}

// leaseScript sets KEYS[1] to ARGV[1] for ARGV[2] ms when it is free or
// already ARGV[1]'s: it returns 1 then, and otherwise the id of the
// process that holds it.
var leaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return v
`)

// releaseScript deletes KEYS[1] when ARGV[1] holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)
