package sync

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	stdsync "sync"
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
// a process that dies frees its jobs within TTL. After the token, the
// key names its holder (host, pid and, once stored, the run: see
// jobLockValue), so that a run refused says which run holds the job.
type RedisJobLocks struct {
	rdb    redis.Scripter
	prefix string
	ttl    time.Duration
	log    *slog.Logger
	host   string
	pid    int

	mu   stdsync.Mutex
	held map[string]*heldJobLock // by job, the locks this process holds
}

// heldJobLock is a lock this process holds: nameRun asks its renewal
// loop, the key's one writer, to name the run in the key.
type heldJobLock struct {
	runs chan namedRun
}

// namedRun asks for the run id to be written into the lock's key; done is
// closed once it was tried.
type namedRun struct {
	id   int64
	done chan struct{}
}

// jobLockHolder is who holds a job's lock, as its key says.
type jobLockHolder struct {
	Host string `json:"host"`
	PID  int    `json:"pid"`
	Run  int64  `json:"run,omitempty"`
}

// jobLockValue is the key's value for token held by h: the token, a
// space, and h as JSON. Earlier versions wrote the bare token; the
// scripts compare the token alone (the part before the first space).
func jobLockValue(token string, h jobLockHolder) string {
	b, _ := json.Marshal(h)
	return token + " " + string(b)
}

// parseJobLockHolder returns the holder a key's value names, nil for a
// bare token (an earlier version's) or one it cannot read.
func parseJobLockHolder(v string) *jobLockHolder {
	_, rest, ok := strings.Cut(v, " ")
	if !ok {
		return nil
	}
	var h jobLockHolder
	if json.Unmarshal([]byte(rest), &h) != nil || h.Host == "" {
		return nil
	}
	return &h
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
	host, _ := os.Hostname()
	return &RedisJobLocks{rdb: rdb, prefix: opts.Key, ttl: opts.TTL, log: opts.Logger,
		host: host, pid: os.Getpid(), held: map[string]*heldJobLock{}}, nil
}

// jobLockRecord is the suffix of the key, kept beside a job's lock and
// without expiry, that says which Redis server (its run_id, new at every
// start of redis-server) has seen the lock held: every acquisition and
// renewal writes it (a job's name holds no ':'). A record missing, or
// naming another server, means the lock may have been lost with Redis's
// data (a restart, even from a snapshot or an AOF missing its last
// second; a failover to a replica that was behind; a FLUSHALL), or was
// never taken in it.
const jobLockRecord = ":record"

// lock runs jobLockScript: it sets key to value for TTL when key is free
// or token's, and reports whether it did, and whether the lock's record
// was missing (fresh: Redis never held the lock, or lost its data); when
// another token holds key, it returns the key's value and how long it
// lasts.
func (l *RedisJobLocks) lock(ctx context.Context, key, token, value string) (ok, fresh bool, held string, expiresIn time.Duration, err error) {
	res, err := jobLockScript.Run(ctx, l.rdb, []string{key, key + jobLockRecord}, token, value, l.ttl.Milliseconds()).Result()
	if err != nil {
		return false, false, "", 0, err
	}
	if n, isInt := res.(int64); isInt && (n == 1 || n == 2) {
		return true, n == 2, "", 0, nil
	}
	if a, isSlice := res.([]any); isSlice && len(a) == 2 {
		held, _ = a[0].(string)
		ms, _ := a[1].(int64)
		return false, false, held, time.Duration(max(ms, 0)) * time.Millisecond, nil
	}
	return false, false, "", 0, fmt.Errorf("unexpected answer %v", res)
}

// LockJob implements JobLocker. A lock whose record is missing or names
// another Redis server (Redis never held it, or may have lost it: a
// restart, with or without persistence, a failover, a FLUSHALL) is taken,
// but LockJob returns only one TTL later (or an error, should ctx end or
// the lock be lost meanwhile; the lock and its record are given up then):
// see fence.
func (l *RedisJobLocks) LockJob(ctx context.Context, job string) (context.Context, func(), error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	token, key := hex.EncodeToString(b[:]), l.prefix+job
	holder := jobLockHolder{Host: l.host, PID: l.pid}
	start := time.Now() // the key lasts until start + ttl at least
	ok, fresh, held, expiresIn, err := l.lock(ctx, key, token, jobLockValue(token, holder))
	if err != nil {
		return nil, nil, fmt.Errorf("sync: lock job %s: %w", job, err)
	}
	if !ok {
		// Held at most TTL more unless its holder renews it: a process
		// that died frees it by then.
		return nil, nil, &jobLockedError{job: job, until: time.Now().Add(l.ttl),
			holder: parseJobLockHolder(held), expiresIn: expiresIn}
	}
	hl := &heldJobLock{runs: make(chan namedRun)}
	l.mu.Lock()
	l.held[job] = hl
	l.mu.Unlock()
	rctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.renew(rctx, cancel, key, token, holder, hl.runs, start)
	}()
	// forget, for a release before the fence passed, deletes the lock's
	// record with it, so that the next process to take the lock waits
	// the fence out too: the run that may hold the lock unseen has not
	// been waited for.
	forget := "0"
	release := func() {
		l.mu.Lock()
		if l.held[job] == hl {
			delete(l.held, job)
		}
		l.mu.Unlock()
		cancel(context.Canceled)
		<-done
		uctx, stop := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer stop()
		if err := jobUnlockScript.Run(uctx, l.rdb, []string{key, key + jobLockRecord}, token, forget).Err(); err != nil {
			l.log.Warn("job lock: release (it expires by itself)", "job", job, "err", err)
		}
	}
	if fresh {
		if err := l.fence(ctx, rctx, job); err != nil {
			forget = "1"
			release()
			return nil, nil, err
		}
	}
	return rctx, release, nil
}

// fence waits one TTL, from now, for the lock of job just taken whose
// record was missing, while its renewal goes on under rctx. ctx is
// LockJob's.
//
// A lock's key is gone when its holder released it (the run ended), when
// it expired (its holder stopped renewing: its run stopped by then, on a
// timer of its own, TTL after the start of its last renewal that
// succeeded), or when Redis lost its data. Only in the last case may its
// holder still run: it finds out at its next renewal, up to TTL/3 later,
// or when its TTL passes unrenewed. The record, a key beside the lock
// with no expiry that every acquisition and renewal sets to the server's
// run_id, tells the cases apart: gone, or naming another server, Redis
// lost the lock with its data or with its restart, whatever it kept (or
// never held the lock: its first use, which waits once). A fence given up
// (ctx ended) deletes the record with the lock, so that the next process
// to take it waits too. The earlier holder's last renewal
// that succeeded started before the data was lost, so before this
// acquisition was answered: its timer stops its run within TTL of now.
// Waiting that out costs one TTL after a loss of data and at a job's first
// lock in a Redis, and nothing after a clean release or an expiry. The
// jobs lease needs no fence of its own: every run, scheduled or not, takes
// its job's lock.
func (l *RedisJobLocks) fence(ctx, rctx context.Context, job string) error {
	if f, ok := ctx.Value(lockWaitKey{}).(func(time.Duration)); ok {
		f(l.ttl)
	}
	l.log.Info("job lock: Redis had no record of this lock (its first use, or Redis lost its data): "+
		"waiting its TTL before the run, for a run that may hold it unseen to stop", "job", job, "ttl", l.ttl)
	t := time.NewTimer(l.ttl)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-rctx.Done():
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sync: lock job %s: %w", job, err)
	}
	return fmt.Errorf("sync: lock job %s: %w", job, context.Cause(rctx))
}

// lockWaitKey is the context key of WithLockWait's function.
type lockWaitKey struct{}

// WithLockWait returns ctx carrying f, which RedisJobLocks.LockJob calls,
// with how long, when, having taken the job's lock, it waits before the
// run may begin (a lock Redis had no record of: see LockJob). A caller that
// shows a run's progress, or answers for it, tells its user so: the run
// has not stalled and has not started either.
func WithLockWait(ctx context.Context, f func(wait time.Duration)) context.Context {
	return context.WithValue(ctx, lockWaitKey{}, f)
}

// nameRun writes the stored run id into the key of job's lock, which this
// process holds, so that a run refused for it names that run; it returns
// once that was tried (a failure is logged at debug level: the key still
// names the host and pid). The scheduler calls it once the run is stored
// (the lock is taken before, so that the run closes those of the job
// left running).
func (l *RedisJobLocks) nameRun(ctx context.Context, job string, id int64) {
	l.mu.Lock()
	hl := l.held[job]
	l.mu.Unlock()
	if hl == nil {
		return
	}
	req := namedRun{id: id, done: make(chan struct{})}
	select {
	case hl.runs <- req:
	case <-ctx.Done():
		return
	}
	select {
	case <-req.done:
	case <-ctx.Done():
	}
}

// runNamer is a JobLocker that can name the run holding a job's lock
// (RedisJobLocks).
type runNamer interface {
	nameRun(ctx context.Context, job string, id int64)
}

var _ runNamer = (*RedisJobLocks)(nil)

// renew renews key while ctx lasts, the key being held since held (when
// the acquisition that took it began), for holder, whose run a request on
// runs names (a renewal at once: this loop is the key's one writer, so a
// renewal does not put back a value without the run); it cancels ctx with ErrJobLockLost
// when another token holds the key, or as soon as TTL has passed since
// the start of the last renewal that succeeded (the key may have expired
// and been taken meanwhile): on a timer of its own, so that a renewal
// hanging on a Redis that does not answer does not keep the run going
// past it, and a renewal answered after that does not count.
func (l *RedisJobLocks) renew(ctx context.Context, cancel context.CancelCauseFunc, key, token string, holder jobLockHolder,
	runs <-chan namedRun, held time.Time) {
	expired := time.AfterFunc(time.Until(held.Add(l.ttl)), func() {
		if ctx.Err() == nil {
			l.log.Warn("job lock: not renewed within its TTL: stopping this run", "key", key, "ttl", l.ttl)
			cancel(fmt.Errorf("%w: not renewed within its TTL (%s; Redis not answering)", ErrJobLockLost, l.ttl))
		}
	})
	defer expired.Stop()
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		var named chan struct{}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case req := <-runs:
			holder.Run, named = req.id, req.done
		}
		start := time.Now()
		ok, _, held, _, err := l.lock(ctx, key, token, jobLockValue(token, holder))
		if named != nil {
			if err != nil {
				l.log.Debug("job lock: naming the run in it", "key", key, "err", err)
			}
			close(named)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && ok:
			if !expired.Stop() {
				return // answered too late: the timer has stopped the run
			}
			expired.Reset(time.Until(start.Add(l.ttl)))
		case err == nil:
			// Another token holds it: another process's, or one Redis
			// brought back with a snapshot (a run since ended may hold it
			// until it expires).
			by := "another holder"
			if h := parseJobLockHolder(held); h != nil {
				by = fmt.Sprintf("host %s pid %d", h.Host, h.PID)
				if h.Run > 0 {
					by += fmt.Sprintf(" run %d", h.Run)
				}
			}
			l.log.Warn("job lock: now held by "+by+" (another process, or a lock Redis restored from a snapshot): stopping this run", "key", key)
			cancel(fmt.Errorf("%w: now held by %s", ErrJobLockLost, by))
			return
		default:
			l.log.Debug("job lock: renewal failed (the lock still holds until its TTL)", "key", key, "err", err)
		}
	}
}

// jobLockedError is LockJob's refusal while another process holds the
// job's lock; it wraps ErrJobRunning, and names the holder when the key
// does (not a bare token, as earlier versions wrote) and how long the key
// lasts unless renewed.
type jobLockedError struct {
	job       string
	until     time.Time
	holder    *jobLockHolder
	expiresIn time.Duration
}

func (e *jobLockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s: %v in another process (", e.job, ErrJobRunning)
	if h := e.holder; h != nil {
		fmt.Fprintf(&b, "host %s pid %d, ", h.Host, h.PID)
		if h.Run > 0 {
			fmt.Fprintf(&b, "run %d, ", h.Run)
		}
	}
	fmt.Fprintf(&b, "lock expires in %s)", e.expiresIn.Round(time.Second))
	return b.String()
}

func (e *jobLockedError) Unwrap() error { return ErrJobRunning }

// HeldUntil implements heldElsewhere: the lock expires by then unless
// its holder renews it, so the scheduler tries a skipped run again then.
func (e *jobLockedError) HeldUntil() time.Time { return e.until }

// jobLockScript sets KEYS[1] to ARGV[2] for ARGV[3] ms when it is free or
// held by the token ARGV[1] (the value itself, an earlier version's bare
// token, or its part before the first space), and sets its record KEYS[2]
// (no expiry) to the server's run_id; it returns 1 then, 2 when the record
// was missing or named another server, and otherwise the value and its
// PTTL. A server that will not tell its run_id (INFO refused) is named
// "unknown": the record then tells only whether it is there.
var jobLockScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] or string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  local info = redis.pcall('INFO', 'server')
  local id = type(info) == 'string' and string.match(info, 'run_id:(%w+)') or 'unknown'
  local rec = redis.call('GET', KEYS[2])
  redis.call('SET', KEYS[2], id)
  if rec ~= id then
    return 2
  end
  return 1
end
return {v, redis.call('PTTL', KEYS[1])}
`)

// jobUnlockScript deletes KEYS[1] when the token ARGV[1] holds it (as
// jobLockScript compares it), and its record KEYS[2] too when ARGV[2] is
// "1".
var jobUnlockScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or (v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ') then
  if ARGV[2] == '1' then
    redis.call('DEL', KEYS[2])
  end
  return redis.call('DEL', KEYS[1])
end
return 0
`)
