package governor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of RedisOptions.
const (
	DefaultRedisPrefix = "backstop:governor:"
	// DefaultHolderTTL is how long the requests a process has in flight
	// keep counting against the shared budget after it last wrote it: a
	// process that died with requests in flight stops holding them then.
	// A live process renews its entry every third of it while it has
	// requests in flight, however long they take.
	DefaultHolderTTL = 15 * time.Second
	// DefaultKeyTTL is how long an untouched budget stays in Redis.
	DefaultKeyTTL = time.Hour
)

// maxRenewIdle is how long after a process's last call on a key its
// requests in flight there are renewed at most (see renew).
const maxRenewIdle = 2 * time.Minute

// skewTolerance is the difference between this process's clock and
// Redis's below which the shared state is read and written in this
// process's time as it is: network delays make smaller measures noise.
const skewTolerance = time.Second

// maxCASAttempts bounds the compare-and-set retries of one call. Each
// failed attempt returns the state that won, so a retry only loses again
// when yet another process wrote in between.
const maxCASAttempts = 1000

// ErrContention is returned when a budget kept changing under one call for
// maxCASAttempts attempts.
var ErrContention = errors.New("governor: shared budget changed on every attempt")

// RedisOptions configure a RedisStore. Zero fields take the defaults above.
type RedisOptions struct {
	// Prefix namespaces the Redis keys: a budget lives at Prefix + KeyID.
	Prefix string
	// HolderTTL bounds how long a process's in-flight requests count after
	// its last write (see DefaultHolderTTL): how long the budget a process
	// that died held stays taken. The store renews its entry every third
	// of it while it has requests in flight, so a request may take longer.
	HolderTTL time.Duration
	// KeyTTL is how long an untouched budget is kept.
	KeyTTL time.Duration
}

// RedisStore is a Store in Redis: every process that uses the same Redis
// shares one budget per API key, so that together they stay inside the
// key's rate limit, and a 429 seen by one pauses all.
//
// Budget's rules run in Go, in the process that asks; Redis keeps the
// serialized state with a version, and a Lua script swaps it only when the
// version is still the one the rules ran on (compare-and-set). A lost race
// re-runs the rules on the state that won. So the pacing rules have one
// home, Budget, and a reservation is as atomic as with MemoryStore.
//
// In-flight requests are counted per process (a holder), each entry
// expiring HolderTTL after that process last wrote, and renewed in the
// background every third of it while the process has requests in flight:
// the requests of a process that died stop counting within HolderTTL (a
// probe request among them, which holds the key for every process until
// it is answered), however long a live process's requests take. Keys are
// KeyID values, never API keys.
//
// The times in the shared state (a 429 pause's end, a holder's expiry,
// the last grant, the window's reset) are Redis's time, so that processes
// whose clocks differ by minutes agree on them: every answer of Redis
// carries its clock, and a process whose clock is off by more than a
// second (skewTolerance) moves the times it reads and writes by the
// difference. (X-RateLimit-Reset comes from parseHeaders in this
// process's time, already moved from the platform's clock when that is
// apart.) Until a process has Redis's clock, a key it has not read is
// read before it is written.
type RedisStore struct {
	rdb       redis.Scripter
	prefix    string
	id        string // this store's holder id
	holderTTL time.Duration
	keyTTL    time.Duration
	// clock is this process's clock (time.Now; tests move it). skew is
	// Redis's time less clock's, as last measured, 0 within skewTolerance.
	clock func() time.Time
	skew  atomic.Int64
	timed atomic.Bool // whether skew has been measured

	mu   sync.Mutex
	keys map[string]*redisKey
	// done ends the renewals (Close, which sets closed under mu);
	// renewals counts those running. renewIdle is maxRenewIdle (tests
	// shorten it).
	done      chan struct{}
	closed    bool
	renewals  sync.WaitGroup
	renewIdle time.Duration
}

var _ Store = (*RedisStore)(nil)

// redisKey is what this store knows of one key. Its lock serializes the
// process's own calls on the key, so they never race each other in Redis;
// it is a semaphore so that a Reserve waiting for it can give up when its
// context ends (Redis not answering the call ahead of it).
type redisKey struct {
	lock chan struct{}
	// out counts this store's grants not yet observed.
	out int
	// version and raw are the state last read or written, tried first by
	// the next call, so that a call takes one round trip while no other
	// process writes the key; a lost race costs one more, and refreshes
	// them. known is false before the first call and after a failure.
	version int64
	raw     []byte
	known   bool
	// at is the time of the last call (the caller's clock), atReal when it
	// came (the monotonic clock): a renewal runs at at plus the time
	// since, and ends once that is too long ago. renewing is set while a
	// goroutine renews this process's holder entry (see renew).
	at, atReal time.Time
	renewing   bool
}

// NewRedisStore returns a Store kept in the Redis that rdb talks to (a
// *redis.Client, *redis.ClusterClient or ring). The caller owns rdb.
func NewRedisStore(rdb redis.Scripter, opts RedisOptions) *RedisStore {
	if opts.Prefix == "" {
		opts.Prefix = DefaultRedisPrefix
	}
	if opts.HolderTTL <= 0 {
		opts.HolderTTL = DefaultHolderTTL
	}
	if opts.KeyTTL <= 0 {
		opts.KeyTTL = DefaultKeyTTL
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &RedisStore{
		rdb: rdb, prefix: opts.Prefix, id: hex.EncodeToString(id[:]),
		holderTTL: opts.HolderTTL, keyTTL: opts.KeyTTL, clock: time.Now,
		keys: make(map[string]*redisKey), done: make(chan struct{}), renewIdle: maxRenewIdle,
	}
}

// Close stops renewing this store's holder entries, as a process that
// died would: the requests it still has in flight stop counting HolderTTL
// after its last write. The store still answers calls, without renewing.
func (s *RedisStore) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	s.mu.Unlock()
	s.renewals.Wait()
	return nil
}

// renew keeps this process's holder entry on key alive while it has
// requests in flight: every third of HolderTTL it writes the entry again,
// and it ends once none is in flight, or at Close. A tick finding another
// call of this process on the key under way, or the last one failed (Redis
// not answering: the FallbackStore paces locally meanwhile), is skipped:
// once Redis hangs, a renewal keeps a request's Observe waiting at most
// once, for the one call that found out (bounded by the client's read
// timeout, as any call on the key is). The entry may then expire, and the
// process's requests stop counting for the others until its next write.
//
// Requests still counted maxRenewIdle after the process's last call on
// the key are taken for ones it lost (a Ticket never ended: none takes
// that long, source.timeout and a target's timeouts being far shorter),
// and renewed no more: they stop counting one HolderTTL later, rather than
// holding the key for every process for as long as this one runs.
func (s *RedisStore) renew(key string, k *redisKey) {
	defer s.renewals.Done()
	tick := time.NewTicker(max(s.holderTTL/3, time.Millisecond))
	defer tick.Stop()
	idle := max(s.renewIdle, 4*s.holderTTL)
	for {
		select {
		case <-s.done:
			s.stopRenewing(k)
			return
		case <-tick.C:
		}
		select {
		case k.lock <- struct{}{}:
		default:
			continue // a call under way writes the entry, or fails
		}
		if k.out == 0 || time.Since(k.atReal) > idle {
			k.renewing = false
			<-k.lock
			return
		}
		if k.known {
			ctx, cancel := context.WithTimeout(context.Background(), max(s.holderTTL/3, time.Millisecond))
			_ = s.updateLocked(ctx, key, k, k.at.Add(time.Since(k.atReal)), false, true,
				func(*Budget, time.Time, time.Duration) bool { return false })
			cancel()
		}
		<-k.lock
	}
}

// stopRenewing marks k as renewed by no goroutine.
func (s *RedisStore) stopRenewing(k *redisKey) {
	k.lock <- struct{}{}
	k.renewing = false
	<-k.lock
}

// Reserve implements Store. Its errors are Redis's (wrapped),
// ErrContention, and ctx's when it ends while another call of this process
// on the key is still waiting for Redis.
func (s *RedisStore) Reserve(ctx context.Context, key string, now time.Time, p Policy) (time.Duration, bool, error) {
	var wait time.Duration
	var granted bool
	err := s.update(ctx, key, now, false, func(b *Budget, now time.Time, _ time.Duration) bool {
		wait, granted = b.Reserve(now, p)
		return granted
	})
	if err != nil {
		return 0, false, err
	}
	return wait, granted, nil
}

// Observe implements Store. The request's in-flight slot is released even
// when the call fails: the next successful write restates this process's
// count.
func (s *RedisStore) Observe(ctx context.Context, key string, now time.Time, obs Observation, p Policy) error {
	return s.update(ctx, key, now, true, func(b *Budget, now time.Time, skew time.Duration) bool {
		o := obs
		if !o.Granted.IsZero() {
			o.Granted = o.Granted.Add(skew)
		}
		if o.HasBudget && !o.Reset.IsZero() {
			o.Reset = o.Reset.Add(skew) // Snapshot moves it back
		}
		b.Observe(now, o, p)
		return false
	})
}

// LiftPause implements PauseLifter: the pause ends for every process
// sharing the key.
func (s *RedisStore) LiftPause(ctx context.Context, key string, now time.Time, _ Policy) error {
	return s.update(ctx, key, now, false, func(b *Budget, _ time.Time, _ time.Duration) bool {
		b.LiftPause()
		return false
	})
}

// Snapshot implements Store: the shared state, read now.
func (s *RedisStore) Snapshot(ctx context.Context, key string, now time.Time, p Policy) (State, error) {
	_, raw, err := s.read(ctx, s.prefix+key)
	if err != nil {
		return State{}, err
	}
	st, err := decodeShared(raw)
	if err != nil {
		return State{}, err
	}
	skew := s.skewNow()
	st.Budget.InFlight = st.inFlight(now.Add(skew))
	state := st.Budget.State(now.Add(skew), p)
	// Back to this process's time, which its caller compares them with.
	if !state.PausedUntil.IsZero() {
		state.PausedUntil = state.PausedUntil.Add(-skew)
	}
	if !state.Reset.IsZero() {
		state.Reset = state.Reset.Add(-skew)
	}
	return state, nil
}

// skewNow returns Redis's time less this process's, as last measured.
func (s *RedisStore) skewNow() time.Duration { return time.Duration(s.skew.Load()) }

// measured records the clock of Redis, answering between sent and
// received (this process's clock).
func (s *RedisStore) measured(redisNow, sent, received time.Time) {
	if redisNow.IsZero() {
		return
	}
	skew := redisNow.Sub(sent.Add(received.Sub(sent) / 2))
	if skew > -skewTolerance && skew < skewTolerance {
		skew = 0
	}
	s.skew.Store(int64(skew))
	s.timed.Store(true)
}

// update runs op on the key's shared budget at now and writes the result
// back if it changed, running op again on the newer state whenever another
// process wrote first. op runs at now in Redis's time, given skew (Redis's
// time less this process's) for the other times it uses. op reports a
// grant, which this process then holds until an update with observe set
// releases it. op must be safe to run again.
func (s *RedisStore) update(ctx context.Context, key string, local time.Time, observe bool, op func(b *Budget, now time.Time, skew time.Duration) (granted bool)) error {
	k := s.key(key)
	if observe {
		// An observation must release its slot, so it waits its turn
		// whatever its context; with the context done, its turn is short.
		k.lock <- struct{}{}
	} else {
		select {
		case k.lock <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("governor: redis: %w", ctx.Err())
		}
	}
	defer func() {
		k.at, k.atReal = local, time.Now()
		if k.out > 0 && !k.renewing {
			s.mu.Lock()
			if !s.closed {
				k.renewing = true
				s.renewals.Add(1)
				go s.renew(key, k)
			}
			s.mu.Unlock()
		}
		<-k.lock
	}()
	return s.updateLocked(ctx, key, k, local, observe, false, op)
}

// updateLocked is update with k's lock held; renew, set, writes this
// process's holder entry whether or not it is due (see hold).
func (s *RedisStore) updateLocked(ctx context.Context, key string, k *redisKey, local time.Time, observe, renew bool,
	op func(b *Budget, now time.Time, skew time.Duration) (granted bool)) error {
	rkey := s.prefix + key
	fail := func(err error) error {
		if observe {
			k.out = max(k.out-1, 0) // the request is over all the same
		}
		k.known = false // the state may be gone (a restarted Redis)
		return err
	}

	// The state last read or written is tried first. With none (the first
	// call on the key, or the first after a failure, when Redis may have
	// lost it), the key is taken to be absent: the compare-and-set creates
	// it, or answers with the state that is there, so that trying costs no
	// more than reading first.
	version, raw, fresh := k.version, k.raw, false
	if !k.known {
		version, raw = 0, nil
	}
	// A process that has not yet heard Redis's clock would create the key
	// with times in its own (a reset, the last grant, its holder entry):
	// minutes off for a clock minutes apart, so that a probe that died
	// held the key for minutes, or none at all. Its first call reads.
	if !k.known && !s.timed.Load() {
		var err error
		if version, raw, err = s.read(ctx, rkey); err != nil {
			return fail(err)
		}
		fresh = true
	}
	for range maxCASAttempts {
		st, err := decodeShared(raw)
		if err != nil {
			return fail(err)
		}
		// Each attempt at the latest measure of Redis's clock: a first
		// call on a key held by others learns it from their answer.
		skew := s.skewNow()
		now := local.Add(skew)
		st.hold(s.id, k.out, now, s.holderTTL, renew)
		out := k.out
		switch {
		case op(&st.Budget, now, skew):
			out++
		case observe:
			out = max(out-1, 0)
		}
		st.hold(s.id, out, now, s.holderTTL, renew)
		next, err := json.Marshal(st)
		if err != nil {
			return fail(fmt.Errorf("governor: encode budget: %w", err))
		}
		if bytes.Equal(next, raw) {
			if fresh {
				k.out, k.version, k.raw, k.known = out, version, raw, true
				return nil
			}
			// Nothing to write, but the decision was made on what this
			// process saw last: decide again on the current state.
			if version, raw, err = s.read(ctx, rkey); err != nil {
				return fail(err)
			}
			fresh = true
			continue
		}
		won, cur, curRaw, err := s.swap(ctx, rkey, version, next)
		if err != nil {
			return fail(err)
		}
		if won {
			k.out, k.version, k.raw, k.known = out, cur, next, true
			return nil
		}
		version, raw, fresh = cur, curRaw, true
	}
	return fail(fmt.Errorf("%w (%d attempts)", ErrContention, maxCASAttempts))
}

func (s *RedisStore) key(key string) *redisKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[key]
	if k == nil {
		k = &redisKey{lock: make(chan struct{}, 1)}
		s.keys[key] = k
	}
	return k
}

// read returns the key's version and state (0 and nil when absent).
func (s *RedisStore) read(ctx context.Context, rkey string) (int64, []byte, error) {
	sent := s.clock()
	res, err := readScript.Run(ctx, s.rdb, []string{rkey}).Slice()
	if err != nil {
		return 0, nil, fmt.Errorf("governor: redis read: %w", err)
	}
	res = s.takeTime(res, sent)
	return parseVersioned(res)
}

// takeTime reads Redis's clock from the two last elements of a script's
// answer (TIME's seconds and microseconds), records it (see measured), and
// returns the answer without them.
func (s *RedisStore) takeTime(res []any, sent time.Time) []any {
	received := s.clock()
	if len(res) < 2 {
		return res
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(res[len(res)-2]), 10, 64)
	usec, err2 := strconv.ParseInt(fmt.Sprint(res[len(res)-1]), 10, 64)
	if err1 == nil && err2 == nil && sec > 0 {
		s.measured(time.Unix(sec, usec*1000), sent, received)
	}
	return res[:len(res)-2]
}

// swap writes next when the stored version is still version. It returns
// whether it did, and the version now stored with, when it did not, the
// state that is.
func (s *RedisStore) swap(ctx context.Context, rkey string, version int64, next []byte) (bool, int64, []byte, error) {
	sent := s.clock()
	res, err := casScript.Run(ctx, s.rdb, []string{rkey}, version, next, s.keyTTL.Milliseconds(), firstVersion()).Slice()
	if err != nil {
		return false, 0, nil, fmt.Errorf("governor: redis write: %w", err)
	}
	res = s.takeTime(res, sent)
	if len(res) == 0 {
		return false, 0, nil, errors.New("governor: redis write: empty answer")
	}
	won, _ := res[0].(int64)
	if won == 1 {
		v, _, err := parseVersioned(res[1:])
		return true, v, nil, err
	}
	v, raw, err := parseVersioned(res[1:])
	return false, v, raw, err
}

// parseVersioned reads the {version, state} pair the scripts return.
func parseVersioned(res []any) (int64, []byte, error) {
	if len(res) == 0 {
		return 0, nil, errors.New("governor: redis: empty answer")
	}
	var v int64
	switch x := res[0].(type) {
	case int64:
		v = x
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, nil, fmt.Errorf("governor: redis: bad version %q", x)
		}
		v = n
	default:
		return 0, nil, fmt.Errorf("governor: redis: bad version %v", x)
	}
	if len(res) < 2 {
		return v, nil, nil
	}
	str, _ := res[1].(string)
	if str == "" {
		return v, nil, nil
	}
	return v, []byte(str), nil
}

// readScript returns {version, state} of KEYS[1], {0, ""} when absent,
// followed by Redis's TIME (seconds, microseconds).
var readScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'v', 's')
local t = redis.call('TIME')
return {tonumber(r[1] or '0'), r[2] or '', t[1], t[2]}
`)

// casScript stores ARGV[2] as the state of KEYS[1] when its version is
// still ARGV[1], and keeps the key ARGV[3] ms. The next version is the
// stored one plus 1, or ARGV[4] (a random starting point) when the key is
// absent: a key that expired or a Redis that restarted empty then does not
// count its versions from 1 again, so a process holding a version from
// before cannot match a different state by chance (ABA). It returns
// {1, new version}, or {0, version, state} when another write won, each
// followed by Redis's TIME (seconds, microseconds; after an empty state
// for the first).
var casScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'v', 's')
local v = tonumber(r[1] or '0')
local t = redis.call('TIME')
if v ~= tonumber(ARGV[1]) then
  return {0, v, r[2] or '', t[1], t[2]}
end
local nv = v + 1
if r[1] == false then
  nv = tonumber(ARGV[4])
end
redis.call('HSET', KEYS[1], 'v', nv, 's', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, nv, '', t[1], t[2]}
`)

// firstVersion returns a random version for a key written the first time:
// in [1, 2^40), so versions stay exact in Lua's doubles for any run.
func firstVersion() int64 { return mrand.Int64N(1<<40-1) + 1 }

// shared is a key's state as stored in Redis: the Budget and, per
// process, the requests it has in flight.
type shared struct {
	Budget  Budget            `json:"budget"`
	Holders map[string]holder `json:"holders,omitempty"`
}

// holder is one process's share of the in-flight requests.
type holder struct {
	InFlight int       `json:"in_flight"`
	Until    time.Time `json:"until"` // when it stops counting unless renewed
}

func decodeShared(raw []byte) (shared, error) {
	var st shared
	if len(raw) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return shared{}, fmt.Errorf("governor: decode shared budget: %w", err)
	}
	return st, nil
}

// inFlight drops the holders expired at now and sums the others.
func (st *shared) inFlight(now time.Time) int {
	n := 0
	for id, h := range st.Holders {
		if !now.Before(h.Until) {
			delete(st.Holders, id)
			continue
		}
		n += h.InFlight
	}
	return n
}

// hold records that holder id has out requests in flight at now, renewing
// its entry when less than half its ttl is left, or at once with renew,
// and restates the Budget's in-flight count as the sum over holders.
func (st *shared) hold(id string, out int, now time.Time, ttl time.Duration, renew bool) {
	switch h, ok := st.Holders[id]; {
	case out == 0:
		delete(st.Holders, id)
	case ok && h.InFlight == out && !renew && h.Until.Sub(now) > ttl/2:
	default:
		if st.Holders == nil {
			st.Holders = make(map[string]holder)
		}
		st.Holders[id] = holder{InFlight: out, Until: now.Add(ttl).UTC().Round(0)}
	}
	if len(st.Holders) == 0 {
		st.Holders = nil
	}
	st.Budget.InFlight = st.inFlight(now)
}
