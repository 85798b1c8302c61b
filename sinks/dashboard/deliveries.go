package dashboard

import (
	"context"
	"errors"
	"fmt"
	"github.com/backstop-sync/backstop/sinks/intake"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/delivery"
)

// redirectTimeout bounds a Redirect from the dashboard, target's timeout
// included: well within serve's write timeout (30 s), after which the
// browser would get no answer at all.
const redirectTimeout = 20 * time.Second

// statuses are the delivery statuses in the order the filter lists them.
var statuses = []string{delivery.StatusPending, delivery.StatusRetrying, delivery.StatusDelivered, delivery.StatusDeadLetter}

// deliveryView is a delivery with its attempts, as a row of the log shows it.
type deliveryView struct {
	delivery.Row
	// Attempts are the attempts shown: on the delivery's own page all of
	// them, in a row of the log the last rowAttempts; AttemptsTotal is
	// how many there are in all.
	Attempts      []delivery.Attempt
	AttemptsTotal int
	// Version is the UpdatedAt the page was drawn with; Retry acts only
	// while the delivery still has it.
	Version string
	// NextAt is when a queued delivery is really attempted next: its own
	// NextAttemptAt, or the end of its target's pause when that is later.
	// It is zero when the delivery is not attempted at all for now (its
	// target is disabled or not in the configuration); NextNote then says
	// why, and otherwise whether the time is the target's pause.
	NextAt   time.Time
	NextNote string
}

type deliveriesData struct {
	Filter     DeliveryFilter
	Page       int
	PrevURL    string
	NextURL    string
	Rows       []deliveryView
	Targets    []Target
	Statuses   []string
	EventTypes []string
	// Dead is the dead-letter view: per-target retry-all buttons, no
	// status filter.
	Dead bool
	// Since is the start of the window of delivered deliveries the log
	// shows; queued ones and dead letters are shown whatever their age.
	Since time.Time
	// FirstURL, set when the page asked for is past the end of the list,
	// links to its first page.
	FirstURL string
	// Shown is when the page was rendered (RFC 3339), sent back by its
	// retry-all buttons.
	Shown string
}

// maxPage is the highest page number of a delivery list: far beyond any
// log kept, and low enough that its offset cannot overflow.
const maxPage = 1_000_000

// deliveriesPage is the delivery log: filters, pages, one expandable row per
// delivery.
func (d *Dashboard) deliveriesPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	status := q.Get("status")
	if status != "" && !contains(statuses, status) {
		d.fail(w, r, http.StatusBadRequest, "bad_filter", fmt.Sprintf("Status %q is not one of pending, retrying, delivered, dead_letter.", status))
		return
	}
	d.deliveryList(w, r, status, false, "deliveries")
}

// deadLettersPage lists the dead letters (kept until retried or purged,
// whatever their age) with a retry-all button per target.
func (d *Dashboard) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	d.deliveryList(w, r, delivery.StatusDeadLetter, true, "dead")
}

// deliveryList draws a page of the delivery log. Pages are drawn from a
// row (before: the last row of the page shown, after: its first), not an
// offset, so deliveries queued while someone pages neither push a row onto
// the next page (seen twice) nor hide one; page is the page's number, for
// show.
func (d *Dashboard) deliveryList(w http.ResponseWriter, r *http.Request, status string, dead bool, nav string) {
	q := r.URL.Query()
	pageNo := 1
	if s := q.Get("page"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPage {
			d.fail(w, r, http.StatusBadRequest, "bad_page", fmt.Sprintf("Page %q is not a page number from 1 to %d.", s, maxPage))
			return
		}
		pageNo = n
	}
	var before, after int64
	for _, p := range []struct {
		name string
		to   *int64
	}{{"before", &before}, {"after", &after}} {
		if s := q.Get(p.name); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 1 {
				d.fail(w, r, http.StatusBadRequest, "bad_page", fmt.Sprintf("%s=%q is not a delivery id.", p.name, s))
				return
			}
			*p.to = n
		}
	}
	if before > 0 && after > 0 {
		d.fail(w, r, http.StatusBadRequest, "bad_page", "A page is drawn before a delivery or after one, not both.")
		return
	}
	if before == 0 && after == 0 {
		pageNo = 1 // the newest deliveries
	}
	if ev := q.Get("event"); strings.ContainsAny(ev, "*?[") {
		if _, err := path.Match(ev, ""); err != nil {
			d.fail(w, r, http.StatusBadRequest, "bad_filter", fmt.Sprintf("Event type pattern %q is not a glob such as payment.* (%v).", ev, err))
			return
		}
	}
	f := DeliveryFilter{
		Status: status, Target: q.Get("target"), EventType: q.Get("event"),
		Limit: d.opts.PageSize + 1, Before: before, After: after,
	}
	data := deliveriesData{Page: pageNo, Statuses: statuses, EventTypes: backstop.KnownEventTypes, Dead: dead,
		Shown: d.now().UTC().Format(time.RFC3339Nano)}
	if !dead {
		f.DeliveredSince = d.now().Add(-DefaultWindow)
		data.Since = f.DeliveredSince
	}
	ctx := r.Context()
	rows, err := d.opts.Backend.Deliveries(ctx, f)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	// Only the dead-letter view shows the counts.
	if data.Targets, err = d.opts.Backend.Targets(ctx, dead); err != nil {
		d.backendError(w, r, err)
		return
	}
	if after > 0 && len(rows) <= d.opts.PageSize {
		// Nothing newer than these: the page is the first one, full.
		f.After, after, pageNo, data.Page = 0, 0, 1, 1
		if rows, err = d.opts.Backend.Deliveries(ctx, f); err != nil {
			d.backendError(w, r, err)
			return
		}
	}
	more := len(rows) > d.opts.PageSize
	switch {
	case len(rows) == 0 && before > 0:
		// Past the end (what was older has been purged or retried
		// since): a link to the first page, none to another empty one.
		data.FirstURL = pageURL(r.URL, "", 0, 1)
	case after > 0:
		// The oldest deliveries newer than after, newest first; the
		// extra one, the newest, says there are newer ones still.
		rows = rows[1:]
		pageNo = max(pageNo, 2)
		data.Page = pageNo
		data.PrevURL = pageURL(r.URL, "after", rows[0].ID, pageNo-1)
		data.NextURL = pageURL(r.URL, "before", rows[len(rows)-1].ID, pageNo+1)
	default:
		if more {
			rows = rows[:d.opts.PageSize]
			data.NextURL = pageURL(r.URL, "before", rows[len(rows)-1].ID, pageNo+1)
		}
		if before > 0 {
			data.PrevURL = pageURL(r.URL, "after", rows[0].ID, max(pageNo-1, 1))
		}
	}
	for _, row := range rows {
		v, err := d.view(r, row, data.Targets, false)
		if err != nil {
			d.backendError(w, r, err)
			return
		}
		data.Rows = append(data.Rows, v)
	}
	f.Limit = d.opts.PageSize
	data.Filter = f
	title := "Webhook delivery"
	if dead {
		title = "Dead letters"
	}
	d.render(w, r, http.StatusOK, "deliveries", page{Title: title, Nav: nav, Data: data})
}

// rowAttempts is how many attempts a row of the log lists (its last): a
// target answering 429 for an hour makes thousands; the delivery's own
// page lists them all.
const rowAttempts = 10

// view reads the attempts of row (all of them, or only the last
// rowAttempts for a row of the log) and says, from the state of its target
// (one of targets), when it is attempted next.
func (d *Dashboard) view(r *http.Request, row delivery.Row, targets []Target, all bool) (deliveryView, error) {
	var (
		as    []delivery.Attempt
		total int
		err   error
	)
	if all {
		as, err = d.opts.Backend.Attempts(r.Context(), row.ID)
		total = len(as)
	} else {
		as, total, err = d.opts.Backend.LastAttempts(r.Context(), row.ID, rowAttempts)
	}
	if err != nil {
		return deliveryView{}, err
	}
	v := deliveryView{Row: row, Attempts: as, AttemptsTotal: total, Version: backstop.CanonicalTime(row.UpdatedAt)}
	v.NextAt, v.NextNote = nextAttempt(row, targets, d.now())
	return v, nil
}

// nextAttempt says when the queued delivery row is attempted next, as
// deliveries list does: its own time, the end of its target's pause when
// that is later (a row answered 429 is held under its claim until the
// pause ends, keeping its own time), now while a dispatcher has
// it claimed, or not at all (zero, and why) while its target is disabled
// or not in the configuration.
func nextAttempt(row delivery.Row, targets []Target, now time.Time) (time.Time, string) {
	if row.Status != delivery.StatusPending && row.Status != delivery.StatusRetrying {
		return time.Time{}, ""
	}
	i := slices.IndexFunc(targets, func(t Target) bool { return t.Name == row.Target })
	switch {
	case i < 0 || targets[i].Unconfigured:
		return time.Time{}, "never: its target is not in the configuration"
	case targets[i].Disabled:
		return time.Time{}, "when its target is enabled (backstop deliveries targets enable " + row.Target + ")"
	}
	if until := targets[i].PausedUntil; until.After(now) && (until.After(row.NextAttemptAt) || row.LastStatus == http.StatusTooManyRequests) {
		return until, "target paused"
	}
	if row.ClaimedUntil.After(now) {
		return now, "being sent: claimed until " + row.ClaimedUntil.UTC().Format(time.RFC3339) + " at the latest"
	}
	return row.NextAttemptAt, ""
}

// pageURL is u with its page drawn from delivery id (key "before" or
// "after"; none for the first page) and numbered n.
func pageURL(u *url.URL, key string, id int64, n int) string {
	q := u.Query()
	q.Del("before")
	q.Del("after")
	q.Del("page")
	if key != "" {
		q.Set(key, strconv.FormatInt(id, 10))
		q.Set("page", strconv.Itoa(n))
	}
	if len(q) == 0 {
		return u.Path
	}
	return u.Path + "?" + q.Encode()
}

// deliveryPage shows one delivery, expanded.
func (d *Dashboard) deliveryPage(w http.ResponseWriter, r *http.Request) {
	row, ok := d.lookup(w, r)
	if !ok {
		return
	}
	targets, err := d.opts.Backend.Targets(r.Context(), false)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	v, err := d.view(r, row, targets, true)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "delivery", page{Title: fmt.Sprintf("Delivery %d", row.ID), Nav: "deliveries", Data: v})
}

// lookup reads the delivery the path names, or answers 400 or 404.
func (d *Dashboard) lookup(w http.ResponseWriter, r *http.Request) (delivery.Row, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		d.fail(w, r, http.StatusBadRequest, "bad_id", fmt.Sprintf("%q is not a delivery id.", r.PathValue("id")))
		return delivery.Row{}, false
	}
	row, ok, err := d.opts.Backend.Delivery(r.Context(), id)
	if err != nil {
		d.backendError(w, r, err)
		return delivery.Row{}, false
	}
	if !ok {
		d.fail(w, r, http.StatusNotFound, "not_found", fmt.Sprintf("There is no delivery %d (it may have been purged).", id))
		return delivery.Row{}, false
	}
	return row, true
}

// retry requeues a delivery, only while it is as the page showed it
// (status and version from the form): a Retry pressed twice, or sent again
// by the browser, requeues it once, so it gets one new attempt.
func (d *Dashboard) retry(w http.ResponseWriter, r *http.Request) {
	row, ok := d.lookup(w, r)
	if !ok {
		return
	}
	targets, err := d.opts.Backend.Targets(r.Context(), false)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	ti := slices.IndexFunc(targets, func(t Target) bool { return t.Name == row.Target && !t.Unconfigured })
	if ti < 0 {
		d.answer(w, r, http.StatusConflict, fmt.Sprintf("Delivery %d is for target %s, which is not in the configuration: it would never be sent. "+
			"Add the target back, or delete its deliveries with backstop deliveries purge --target %s.", row.ID, row.Target, row.Target),
			fmt.Sprintf("%s/deliveries/%d", Prefix, row.ID))
		return
	}
	seen := row
	if v := r.PostFormValue("version"); v != "" {
		t, err := backstop.ParseTime(v)
		if err != nil {
			d.fail(w, r, http.StatusBadRequest, "bad_version", "The form's version is not a time; reload the page.")
			return
		}
		seen.Status, seen.UpdatedAt = r.PostFormValue("status"), t
	}
	done, err := d.opts.Backend.Retry(r.Context(), seen)
	if errors.Is(err, backstop.ErrNotFound) { // purged since the lookup
		d.fail(w, r, http.StatusNotFound, "not_found", fmt.Sprintf("There is no delivery %d (it may have been purged).", row.ID))
		return
	}
	if fl := (*backstop.InFlightError)(nil); errors.As(err, &fl) {
		d.log.Info("dashboard: retry refused, claimed for sending", "delivery", row.ID, "until", fl.Until)
		d.answer(w, r, http.StatusConflict, fmt.Sprintf("Delivery %d is claimed for sending to %s (its attempt is in flight, "+
			"or waits for a free slot or for a 429's pause to end); nothing was queued, as that would send it twice. "+
			"Its outcome is recorded when the attempt ends: reload this page then, and retry it if it still needs one "+
			"(it is claimed until %s at the latest).",
			row.ID, row.Target, fl.Until.UTC().Format(time.RFC3339)), fmt.Sprintf("%s/deliveries/%d", Prefix, row.ID))
		return
	}
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	msg := fmt.Sprintf("Delivery %d is queued again; %s", row.ID, d.whenSent(targets[ti]))
	code := http.StatusOK
	if !done {
		msg = fmt.Sprintf("Delivery %d changed since this page was drawn (it was retried already, or attempted); nothing was done.", row.ID)
		code = http.StatusConflict
	}
	d.log.Info("dashboard: retry", "delivery", row.ID, "queued", done)
	d.answer(w, r, code, msg, fmt.Sprintf("%s/deliveries/%d", Prefix, row.ID))
}

// redirect sends a delivery once to the URL of the form.
func (d *Dashboard) redirect(w http.ResponseWriter, r *http.Request) {
	row, ok := d.lookup(w, r)
	if !ok {
		return
	}
	raw := r.PostFormValue("url")
	if u, err := url.Parse(raw); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		d.fail(w, r, http.StatusBadRequest, "bad_url", fmt.Sprintf("%q is not an http or https URL.", backstop.RedactURL(raw)))
		return
	}
	back := fmt.Sprintf("%s/deliveries/%d", Prefix, row.ID)
	targets, err := d.opts.Backend.Targets(r.Context(), false)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	if !slices.ContainsFunc(targets, func(t Target) bool { return t.Name == row.Target && !t.Unconfigured }) {
		// It is sent with its target's secret and settings, which are gone.
		d.answer(w, r, http.StatusConflict, fmt.Sprintf("Delivery %d is for target %s, which is not in the configuration: "+
			"it is redirected with its target's secret and settings. Add the target back to redirect it.", row.ID, row.Target), back)
		return
	}
	// Bounded so that the answer reaches the browser before serve's write
	// timeout cuts the connection: a slow URL is a timeout to report.
	ctx, cancel := context.WithTimeout(r.Context(), redirectTimeout)
	defer cancel()
	a, err := d.opts.Backend.Redirect(ctx, row, raw)
	fl := (*backstop.InFlightError)(nil)
	switch {
	case errors.As(err, &fl):
		d.log.Info("dashboard: redirect refused, claimed for sending", "delivery", row.ID, "until", fl.Until)
		d.answer(w, r, http.StatusConflict, fmt.Sprintf("Delivery %d is claimed for sending to %s (its attempt is in flight, "+
			"or waits for a free slot or for a 429's pause to end); nothing was sent, as the attempt in flight has the number "+
			"a redirect would take. Redirect it once that attempt is recorded (it is claimed until %s at the latest).",
			row.ID, row.Target, fl.Until.UTC().Format(time.RFC3339)), back)
	case errors.Is(err, delivery.ErrRefused):
		reason := a.Error
		if reason == "" {
			reason = err.Error()
		}
		d.answer(w, r, http.StatusUnprocessableEntity, fmt.Sprintf("Redirect of delivery %d refused: %s.", row.ID,
			strings.TrimPrefix(reason, "refused: ")), back)
	case err != nil:
		d.backendError(w, r, err)
	case a.StatusCode >= 200 && a.StatusCode < 300:
		d.answer(w, r, http.StatusOK, fmt.Sprintf("Delivery %d sent to %s: %d in %s.", row.ID, a.URL, a.StatusCode, a.Duration.Round(time.Millisecond)), back)
	case a.StatusCode != 0:
		d.answer(w, r, http.StatusOK, fmt.Sprintf("Delivery %d sent to %s, which answered %d.", row.ID, a.URL, a.StatusCode), back)
	default: // no answer at all: the redirect failed
		d.answer(w, r, http.StatusBadGateway, fmt.Sprintf("Delivery %d could not be sent to %s: %s.", row.ID, a.URL, a.Error), back)
	}
}

// retryDead requeues every dead letter of a target.
func (d *Dashboard) retryDead(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	targets, err := d.opts.Backend.Targets(r.Context(), false)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	ti := slices.IndexFunc(targets, func(t Target) bool { return t.Name == name && !t.Unconfigured })
	if ti < 0 {
		d.fail(w, r, http.StatusNotFound, "not_found", fmt.Sprintf("There is no target %q in the configuration.", name))
		return
	}
	// The dead letters as the page showed them: a second press (a double
	// click) or a stale page does not queue one that became a dead
	// letter since. A form without the time (an older page) takes now.
	shown := d.now()
	if t, err := time.Parse(time.RFC3339Nano, r.PostFormValue("shown")); err == nil && t.Before(shown) {
		shown = t
	}
	n, err := d.opts.Backend.RetryDead(r.Context(), name, shown)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	d.log.Info("dashboard: retry dead letters", "target", name, "queued", n)
	msg := fmt.Sprintf("No dead letters of %s were left to queue again: those the page showed are queued already.", name)
	if n > 0 {
		msg = fmt.Sprintf("%d dead letters of %s queued again; %s", n, name, d.whenSent(targets[ti]))
	}
	d.answer(w, r, http.StatusOK, msg, Prefix+"/dead-letters")
}

// whenSent says when deliveries just queued again for t are sent: within a
// second or so, or not before t's pause ends, or not until t is enabled.
func (d *Dashboard) whenSent(t Target) string {
	switch {
	case t.Disabled:
		return fmt.Sprintf("but target %s is disabled (%s): nothing is sent to it until it is enabled with backstop deliveries targets enable %s.",
			t.Name, t.DisabledReason, t.Name)
	case t.PausedUntil.After(d.now()):
		return fmt.Sprintf("target %s is paused until %s (it answered 429), so the next attempt is made then.", t.Name, when(t.PausedUntil))
	}
	return "the next attempt is made within a second or so."
}

// answer ends a POST: a browser submitting a form is sent back to a page
// (back) that shows msg; a script gets {"message": msg} with code, or, for
// a refusal (code 400 or more), the error body every other error has
// ({"error":{"code","message"}}).
func (d *Dashboard) answer(w http.ResponseWriter, r *http.Request, code int, msg, back string) {
	if !wantsHTML(r) {
		if code >= 400 {
			intake.WriteError(w, code, refusalCode(code), msg)
			return
		}
		writeJSON(w, code, map[string]string{"message": msg})
		return
	}
	flash(w, r, msg)
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// refusalCode is the error code of a refused POST's answer.
func refusalCode(status int) string {
	switch status {
	case http.StatusConflict:
		return "conflict"
	}
	return strings.ReplaceAll(strings.ToLower(http.StatusText(status)), " ", "_")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
