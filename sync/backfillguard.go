package sync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/backstop-sync/backstop"
)

// ErrSilentBackfill is wrapped by CheckBackfill's refusal: a backfill that
// does not emit would write changes targets subscribe to into the mirror
// without their events, and they would then never be emitted.
var ErrSilentBackfill = errors.New("a backfill without emitting would lose events")

// objectCounter is a Mirror that counts its objects (store.DB is one).
type objectCounter interface {
	Count(ctx context.Context, r backstop.Resource) (int, error)
}

// checkpointEmitter is a Mirror that tells whether the backfill that saved
// a checkpoint emitted (store.DB is one).
type checkpointEmitter interface {
	CheckpointEmitted(ctx context.Context, chk backstop.Cursor) (bool, error)
}

// CheckBackfill says whether a backfill of r that does not emit (Backfill,
// as opposed to BackfillEmit) may run without losing events, given the
// routes of the configured targets.
//
// Such a backfill writes every object newer than the mirror's version into
// the mirror without an event. Sync and reconcile then find those objects
// unchanged, so on a resource whose changes are already being emitted the
// changes it writes never reach the targets. It is therefore allowed only
// where that cannot happen:
//
//   - no route subscribes to any of r's event types;
//   - the backfill already finished and restart is false (it reads nothing);
//   - it is r's first fill: r has no sync cursor, and its mirror is empty or
//     an unfinished backfill checkpoint is being resumed, one that a
//     backfill without emitting left (resuming one that emitted without
//     emitting would send the targets only the objects read before the
//     interruption).
//
// Otherwise (r has a sync cursor, or objects in the mirror that no backfill
// of this store is filling, as after `cursors reset` or when only the
// webhooks have filled it) it returns an error wrapping ErrSilentBackfill
// that names the subscribed targets and says why. Other errors are the
// store's.
func (e *Engine) CheckBackfill(ctx context.Context, r backstop.Resource, restart bool, routes []backstop.Route) error {
	subs := subscribers(r, routes)
	if len(subs) == 0 {
		return nil
	}
	chk, hasChk, err := e.Mirror.Cursor(ctx, r, backstop.CursorBackfill)
	if err != nil {
		return fmt.Errorf("backfill %s: %w", r, err)
	}
	if hasChk && chk.Done && !restart {
		return nil
	}
	_, syncing, err := e.Mirror.Cursor(ctx, r, backstop.CursorSync)
	if err != nil {
		return fmt.Errorf("backfill %s: %w", r, err)
	}
	var why string
	switch {
	case syncing:
		why = fmt.Sprintf("%s is already being synced (it has a sync cursor)", r)
	case hasChk && !chk.Done:
		c, ok := e.Mirror.(checkpointEmitter)
		if !ok {
			return nil // resuming the first fill
		}
		emitted, err := c.CheckpointEmitted(ctx, chk)
		if err != nil {
			return fmt.Errorf("backfill %s: %w", r, err)
		}
		if !emitted {
			return nil // resuming the first fill
		}
		why = fmt.Sprintf("the unfinished backfill of %s was run with --emit (the targets have the events of what it read so far, and would miss the rest)", r)
	default:
		c, ok := e.Mirror.(objectCounter)
		if !ok {
			return nil
		}
		n, err := c.Count(ctx, r)
		if err != nil {
			return fmt.Errorf("backfill %s: %w", r, err)
		}
		if n == 0 {
			return nil
		}
		why = fmt.Sprintf("the mirror already holds %d %s that no backfill is filling", n, r)
	}
	return fmt.Errorf("backfill %s: %w: %s and %s; the newer versions it would write to the mirror "+
		"would never be emitted, since sync and reconcile would then find them unchanged",
		r, ErrSilentBackfill, why, strings.Join(subs, ", "))
}

// ErrFirstFillUnfinished is wrapped by the refusal of a sync that emits
// (SyncEmit) on a resource whose first fill, a backfill without emitting,
// is unfinished: the sync would read the feed from its start and emit
// every object the backfill has not reached yet as new.
var ErrFirstFillUnfinished = errors.New("its first fill is unfinished")

// checkFirstFill refuses a SyncEmit of r from no sync cursor while r's
// first fill, a backfill that does not emit, is unfinished, when a route
// subscribes to r's events. That fill was run without events so that the
// targets do not get the platform's history; a sync meanwhile would send
// them the part it has not read yet. (Next to a backfill that emits, a
// sync only emits sooner what the backfill would have.)
func (e *Engine) checkFirstFill(ctx context.Context, r backstop.Resource, routes []backstop.Route) error {
	subs := subscribers(r, routes)
	if len(subs) == 0 {
		return nil
	}
	chk, hasChk, err := e.Mirror.Cursor(ctx, r, backstop.CursorBackfill)
	if err != nil || !hasChk || chk.Done {
		return err
	}
	c, ok := e.Mirror.(checkpointEmitter)
	if !ok {
		return nil
	}
	emitted, err := c.CheckpointEmitted(ctx, chk)
	if err != nil || emitted {
		return err
	}
	return fmt.Errorf("%w: the backfill of %s, run without --emit so that the targets do not get its history, "+
		"has not finished, and a sync now would read the feed from its start and emit each of the %s it has not reached yet as new (%s); "+
		"finish it first: %s backfill %s", ErrFirstFillUnfinished, r, r, strings.Join(subs, ", "), e.command(), r)
}

// subscribers describes the routes that subscribe to some event type
// emitted for r: "target crm (contact.created, contact.updated)".
func subscribers(r backstop.Resource, routes []backstop.Route) []string {
	emitted := emittedTypes(r)
	var out []string
	for _, rt := range routes {
		var types []string
		for _, typ := range emitted {
			if backstop.MatchEvents(rt.Events, typ) {
				types = append(types, typ)
			}
		}
		if len(types) > 0 {
			out = append(out, fmt.Sprintf("target %s subscribes to its events (%s)", rt.Target, strings.Join(types, ", ")))
		}
	}
	return out
}

// emittedTypes returns the event types emitted for r's objects: the
// platform's (backstop.KnownEventTypes) and those sync, backfill and
// reconcile make for an object new to the mirror or newer than it
// (backstop.EventTypeFor), such as message.updated, which the platform
// itself never sends.
func emittedTypes(r backstop.Resource) []string {
	var out []string
	for _, typ := range backstop.KnownEventTypes {
		if res, ok := backstop.ResourceOfEventType(typ); ok && res == r {
			out = append(out, typ)
		}
	}
	for _, missing := range []bool{true, false} {
		// Chats and payments take their type from the object's status, all
		// of which the known types list.
		if typ := backstop.EventTypeFor(r, nil, missing); typ != "" && !slices.Contains(out, typ) {
			out = append(out, typ)
		}
	}
	return out
}
