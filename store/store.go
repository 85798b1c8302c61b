// Package store keeps backstop's state in SQLite (modernc.org/sqlite through
// sqlx): the mirror of the platform's objects, the sync cursors, the
// processed events that de-duplicate the emit path and the outbox of
// deliveries. All of the project's SQL lives in this package.
//
// A DB holds one writer connection, through which every write goes, and a
// separate pool of read-only connections. The database runs in WAL mode, so
// readers never wait for the writer. Each public method owns its transaction.
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	sqlite "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/backstop-sync/backstop"
)

// driverName is the database/sql name modernc.org/sqlite registers.
const driverName = "sqlite"

// walSizeLimit is the writer's journal_size_limit: the size the WAL file
// is cut back to when it starts over after a checkpoint. Without it the
// file keeps the largest size it ever reached, such as the hundreds of
// megabytes a long read transaction (a sqlite3 shell, a backup) lets it
// grow to under load, for as long as the process runs.
const walSizeLimit = 64 << 20

//go:embed migrations/*.sql
var migrationFS embed.FS

// Options tunes Open. The zero value is ready to use.
type Options struct {
	// Synchronous is SQLite's synchronous setting: "NORMAL" (the default, a
	// commit survives a process crash) or "FULL" (a commit also survives a
	// power loss; the webhook path, which answers 2xx only after a commit,
	// uses it). "OFF" and "EXTRA" are accepted too.
	Synchronous string
	// BusyTimeout is how long a connection waits for a lock another process
	// holds before failing. Zero means 10s.
	BusyTimeout time.Duration
	// Now stamps synced_at, cursors' UpdatedAt, processed events'
	// received_at and outbox rows' times. Nil means time.Now.
	Now func() time.Time
}

// DB is a backstop store in one SQLite file. It is safe for concurrent use.
type DB struct {
	path string
	now  func() time.Time
	busy time.Duration // the connections' busy timeout

	w *sqlx.DB // the one writer connection
	r *sqlx.DB // read-only pool

	// Statements prepared once on the writer connection and bound to each
	// write transaction with tx.Stmtx, so a page does not re-prepare them.
	upsert     map[backstop.Resource]*sqlx.Stmt
	saveCursor *sqlx.Stmt
	// insertOutboxRows and insertEventRows are the emit path's multi-row
	// inserts, one of each per size in chunks.
	insertOutboxRows [len(chunks)]*sqlx.Stmt
	insertEventRows  [len(chunks)]*sqlx.Stmt
	delivery         *deliveryStmts

	// releaseOpen releases the store's open claim (openClaimName), held
	// shared for as long as the DB is open.
	releaseOpen func() error

	closeOnce sync.Once
	closeErr  error
}

// openClaimName is the claim every DB holds, shared, while it is open, and
// Restore takes exclusively: a store is replaced only while no backstop
// process has it open, and none opens it meanwhile.
const openClaimName = "open"

var _ backstop.Mirror = (*DB)(nil)

// Open opens the store at path, creating the file when it does not exist, and
// brings its schema up to date by running the embedded migrations that have
// not run yet. Errors name the path. The directory must exist. A file that
// is not SQLite, or an SQLite database another application made, is refused
// with an error wrapping ErrNotStore and left as it was.
func Open(ctx context.Context, path string, opts Options) (*DB, error) {
	db, err := open(ctx, path, opts)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return db, nil
}

func open(ctx context.Context, path string, opts Options) (_ *DB, err error) {
	if path == "" {
		return nil, errors.New("empty path")
	}
	if strings.ContainsAny(path, "?#") || strings.HasPrefix(path, "file:") {
		return nil, errors.New("path must be a plain file name (no '?', '#' or file: prefix)")
	}
	syncMode := strings.ToUpper(strings.TrimSpace(opts.Synchronous))
	switch syncMode {
	case "":
		syncMode = "NORMAL"
	case "OFF", "NORMAL", "FULL", "EXTRA":
	default:
		return nil, fmt.Errorf("synchronous %q: want NORMAL or FULL", opts.Synchronous)
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 10 * time.Second
	}
	db := &DB{path: path, now: opts.Now, busy: busy}
	if db.now == nil {
		db.now = time.Now
	}
	defer func() {
		if err != nil {
			db.Close()
		}
	}()

	busyMS := strconv.FormatInt(busy.Milliseconds(), 10)
	// journal_mode is not among the connection's pragmas: it is a lasting
	// change to the file, made (setWAL) only once the file is known to be
	// a backstop store or a new one (checkOwner). temp_store=MEMORY keeps
	// the writer's statement journals (and sorts) in memory: SQLite's
	// default spills a journal over 64 KiB to a temporary file, and the
	// delivery batcher's multi-row statements wrote every page they
	// touched there (see recordChunk).
	db.w, err = sqlx.Open(driverName, path+"?_txlock=immediate"+
		"&_pragma=busy_timeout("+busyMS+")"+
		"&_pragma=journal_size_limit("+strconv.FormatInt(walSizeLimit, 10)+")"+
		"&_pragma=foreign_keys(1)"+
		"&_pragma=temp_store(MEMORY)"+
		"&_pragma=synchronous("+syncMode+")")
	if err != nil {
		return nil, err
	}
	db.w.SetMaxOpenConns(1)
	db.w.SetMaxIdleConns(1)
	db.w.SetConnMaxLifetime(0)
	db.w.SetConnMaxIdleTime(0)
	// While another process creates the same file (switches it to WAL, runs
	// the migrations), SQLite can answer SQLITE_BUSY at once, without its
	// busy handler: retry within the busy timeout.
	if err := retryBusy(ctx, busy, func() error { return db.w.PingContext(ctx) }); err != nil {
		return nil, explainOpen(path, err)
	}
	if err := retryBusy(ctx, busy, func() error { return db.checkOwner(ctx) }); err != nil {
		return nil, err
	}
	// Before the first write: a store being restored is not written.
	if db.releaseOpen, err = ClaimShared(ctx, path, openClaimName); errors.Is(err, ErrClaimed) {
		return nil, fmt.Errorf("a backstop restore is replacing the store: open it once the restore has finished: %w", err)
	} else if err != nil {
		return nil, err
	}
	if err := retryBusy(ctx, busy, func() error { return db.setWAL(ctx) }); err != nil {
		return nil, err
	}
	if err := retryBusy(ctx, busy, func() error { return db.migrate(ctx) }); err != nil {
		return nil, err
	}

	// journal_mode is a property of the file, set above by the writer; the
	// readers only need to wait on locks and refuse to write.
	db.r, err = sqlx.Open(driverName, path+"?_pragma=busy_timeout("+busyMS+")"+
		"&_pragma=foreign_keys(1)"+
		"&_pragma=temp_store(MEMORY)"+
		"&_pragma=query_only(1)")
	if err != nil {
		return nil, err
	}
	readers := max(4, runtime.GOMAXPROCS(0))
	db.r.SetMaxOpenConns(readers)
	db.r.SetMaxIdleConns(readers)
	if err := retryBusy(ctx, busy, func() error { return db.r.PingContext(ctx) }); err != nil {
		return nil, err
	}

	if err := db.prepare(ctx); err != nil {
		return nil, err
	}
	return db, nil
}

// prepare prepares the statements every write transaction uses.
func (db *DB) prepare(ctx context.Context) error {
	db.upsert = make(map[backstop.Resource]*sqlx.Stmt, len(backstop.Resources))
	for _, r := range backstop.Resources {
		t, err := tableFor(r)
		if err != nil {
			return err
		}
		st, err := db.w.PreparexContext(ctx, t.upsertSQL)
		if err != nil {
			return fmt.Errorf("prepare %s upsert: %w", t.name, err)
		}
		db.upsert[r] = st
	}
	st, err := db.w.PreparexContext(ctx, saveCursorSQL)
	if err != nil {
		return fmt.Errorf("prepare cursor save: %w", err)
	}
	db.saveCursor = st
	for i, n := range chunks {
		if db.insertOutboxRows[i], err = db.w.PreparexContext(ctx, insertOutboxRowsSQL(n)); err != nil {
			return fmt.Errorf("prepare outbox insert of %d rows: %w", n, err)
		}
		if db.insertEventRows[i], err = db.w.PreparexContext(ctx, insertEventRowsSQL(n)); err != nil {
			return fmt.Errorf("prepare event insert of %d rows: %w", n, err)
		}
	}
	return db.prepareDelivery(ctx)
}

// Close closes the store. Methods called after Close return errors. Close is
// safe to call more than once.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		var errs []error
		for _, st := range db.upsert {
			errs = append(errs, st.Close())
		}
		for _, st := range append(append([]*sqlx.Stmt{db.saveCursor}, db.insertOutboxRows[:]...), db.insertEventRows[:]...) {
			if st != nil {
				errs = append(errs, st.Close())
			}
		}
		db.delivery.close()
		if db.r != nil {
			errs = append(errs, db.r.Close())
		}
		if db.w != nil {
			errs = append(errs, db.w.Close())
		}
		if db.releaseOpen != nil {
			errs = append(errs, db.releaseOpen())
		}
		if err := errors.Join(errs...); err != nil {
			db.closeErr = fmt.Errorf("close store %s: %w", db.path, err)
		}
	})
	return db.closeErr
}

// Ping checks that the store can be reached for reading and for writing: it
// waits for the writer connection (behind any write in progress) and for a
// reader, so a readiness probe fails when either is unusable or ctx ends
// first. It returns an error on a closed store.
func (db *DB) Ping(ctx context.Context) error {
	conn, err := db.writer(ctx, pingWriterWait)
	if err == nil {
		err = conn.PingContext(ctx)
		conn.Close()
	}
	if err != nil {
		return fmt.Errorf("ping store %s: writer: %w", db.path, err)
	}
	if err := db.r.PingContext(ctx); err != nil {
		return fmt.Errorf("ping store %s: reader: %w", db.path, err)
	}
	return nil
}

// ErrWriterBusy is returned when the store's one writer connection stays
// taken by other writes for longer than the caller may wait: a webhook
// commit waits at most the busy timeout, a readiness probe a second. It
// passes (LockHeld): the usual cause is another process holding the
// store's write lock while this one's writes each wait their busy timeout
// for it, one after the other.
var ErrWriterBusy = errors.New("the store's writer is taken by other writes")

// pingWriterWait bounds how long Ping waits for the writer connection.
const pingWriterWait = time.Second

// writer returns the writer connection once the writes before have let
// it go, waiting at most wait (then ErrWriterBusy) or until ctx ends. The
// caller closes it.
func (db *DB) writer(ctx context.Context, wait time.Duration) (*sqlx.Conn, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn, err := db.w.Connx(wctx)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("%w: waited %s for it", ErrWriterBusy, wait)
	}
	return conn, err
}

// withBusyTimeout sets the busy timeout of conn, a writer connection, to
// d until restore sets it back to the store's. Both run without ctx's
// cancellation, which could fail a PRAGMA after SQLite applied it; a
// connection whose timeout could not be set back is discarded (database/sql
// closes it, and opens a new one for the next write), so that no later
// write fails at once on a lock held elsewhere for a moment.
func (db *DB) withBusyTimeout(ctx context.Context, conn *sqlx.Conn, d time.Duration) (restore func(), err error) {
	nctx := context.WithoutCancel(ctx)
	restore = func() {
		if _, err := conn.ExecContext(nctx, `PRAGMA busy_timeout = `+strconv.FormatInt(db.busy.Milliseconds(), 10)); err != nil {
			conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	if _, err := conn.ExecContext(nctx, `PRAGMA busy_timeout = `+strconv.FormatInt(d.Milliseconds(), 10)); err != nil {
		restore()
		return nil, err
	}
	return restore, nil
}

// pingWriteBusy bounds how long PingWrite waits for a lock that another
// process holds, so that a readiness probe answers in about a second.
const pingWriteBusy = 500 * time.Millisecond

// PingWrite checks that the store can commit a write now, which Ping does
// not: on the writer connection, behind any write in progress, it writes
// the database header's user_version back unchanged in a transaction of its
// own, waiting at most pingWriteBusy for a lock held elsewhere. A full
// disk, a file that cannot be written or a lock another process keeps
// fails it. It costs a commit: meant for a probe after a failed commit, not
// for every one.
func (db *DB) PingWrite(ctx context.Context) error {
	if err := db.pingWrite(ctx); err != nil {
		return fmt.Errorf("ping store %s: write: %w", db.path, err)
	}
	return nil
}

func (db *DB) pingWrite(ctx context.Context) error {
	conn, err := db.writer(ctx, pingWriterWait)
	if err != nil {
		return err
	}
	defer conn.Close()
	restore, err := db.withBusyTimeout(ctx, conn, pingWriteBusy)
	if err != nil {
		return err
	}
	defer restore()
	tx, err := conn.BeginTxx(ctx, nil) // BEGIN IMMEDIATE (_txlock)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var v int64
	if err := tx.GetContext(ctx, &v, `PRAGMA user_version`); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `PRAGMA user_version = `+strconv.FormatInt(v, 10)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	// The page it wrote fits in room the WAL file already has, also on a
	// full disk, where a webhook batch's commit (tens of pages, the WAL
	// or the file growing) fails: the disk must have room too.
	return checkRoom(filepath.Dir(db.path))
}

// errDiskLow is checkRoom's: Cause names it as a full disk.
var errDiskLow = errors.New("too little free space on the store's disk")

// checkRoom returns errDiskLow when the file system holding dir has less
// free space than a few webhook batches take: 16 MiB, or a tenth of a
// smaller file system. A file system that cannot say is taken to have room.
func checkRoom(dir string) error {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return nil
	}
	free := uint64(fs.Bavail) * uint64(fs.Bsize)
	need := min(uint64(16<<20), uint64(fs.Blocks)*uint64(fs.Bsize)/10)
	if free < need {
		return fmt.Errorf("%w: %d KiB free, want %d KiB", errDiskLow, free>>10, need>>10)
	}
	return nil
}

// Path returns the file name the store was opened with.
func (db *DB) Path() string { return db.path }

// ErrClaimed is returned by Claim and ClaimShared when another connection,
// in this process or another one, holds the claim in a way that excludes
// theirs.
var ErrClaimed = errors.New("claimed by another process")

// Claim takes the claim called name on the store at path, for as long as
// the process keeps it, without opening the store itself (so before its
// migrations run): an exclusive SQLite lock on the file next to the
// database, path + "." + name + "-lock", so that it works wherever SQLite's
// own locking does and ends with the process, however it dies. It fails
// with an error wrapping ErrClaimed, at once, while another holder has it.
// The returned func releases it.
func Claim(ctx context.Context, path, name string) (release func() error, err error) {
	file, c, err := openClaim(path, name, "busy_timeout(0)&_pragma=journal_mode(OFF)&_pragma=locking_mode(EXCLUSIVE)")
	if err != nil {
		return nil, err
	}
	// In EXCLUSIVE locking mode the first write takes the file's exclusive
	// lock and the connection keeps it until it closes.
	if _, err = c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS claim (at TEXT NOT NULL)`); err == nil {
		if _, err = c.ExecContext(ctx, `DELETE FROM claim`); err == nil {
			_, err = c.ExecContext(ctx, `INSERT INTO claim (at) VALUES (?)`, backstop.CanonicalTime(time.Now()))
		}
	}
	if err != nil {
		c.Close()
		if isBusy(err) {
			return nil, fmt.Errorf("claim %s: %w", file, ErrClaimed)
		}
		return nil, fmt.Errorf("claim %s: %w", file, err)
	}
	return c.Close, nil
}

// openClaim opens the one-connection database of the claim called name on
// the store at path, with the given pragmas, and returns its file name.
func openClaim(path, name, pragmas string) (string, *sqlx.DB, error) {
	file := path + "." + name + "-lock"
	c, err := sqlx.Open(driverName, file+"?_pragma="+pragmas)
	if err != nil {
		return file, nil, fmt.Errorf("claim %s: %w", file, err)
	}
	c.SetMaxOpenConns(1)
	c.SetMaxIdleConns(1)
	c.SetConnMaxLifetime(0)
	c.SetConnMaxIdleTime(0)
	return file, c, nil
}

// ClaimShared takes the claim called name on the store at path, as Claim
// does, but shared: any number of processes hold it at once, none while
// Claim's holder has it, and Claim fails while any holds it. It waits up
// to 2 s for another process creating the lock file, then fails with an
// error wrapping ErrClaimed while the exclusive holder has it.
func ClaimShared(ctx context.Context, path, name string) (release func() error, err error) {
	file, c, err := openClaim(path, name, "busy_timeout(2000)&_pragma=journal_mode(OFF)")
	if err != nil {
		return nil, err
	}
	// A read transaction kept open holds the file's shared lock, which
	// Claim's exclusive one cannot be taken beside. It must outlive ctx
	// (serve's, cancelled by SIGTERM): database/sql rolls a transaction
	// back when its context ends, and the claim must last until release,
	// through serve's drain.
	var tx *sqlx.Tx
	if _, err = c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS claim (at TEXT NOT NULL)`); err == nil {
		if tx, err = c.BeginTxx(context.WithoutCancel(ctx), nil); err == nil {
			var n int
			if err = tx.GetContext(ctx, &n, `SELECT count(*) FROM claim`); err != nil {
				tx.Rollback()
			}
		}
	}
	if err != nil {
		c.Close()
		if isBusy(err) {
			return nil, fmt.Errorf("claim %s: %w", file, ErrClaimed)
		}
		return nil, fmt.Errorf("claim %s: %w", file, err)
	}
	return func() error {
		return errors.Join(tx.Rollback(), c.Close())
	}, nil
}

// migration is one embedded schema change, applied once, in version order.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order. File names
// are "NNNN_description.sql"; versions must be unique.
func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	seen := make(map[int]string)
	for _, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and '_'", base)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", prev, base, v)
		}
		seen[v] = base
		body, err := migrationFS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: base, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// ErrNotStore is returned by Open, wrapped, for a file that is not SQLite
// and for an SQLite database that another application made: Open leaves
// such a file as it found it.
var ErrNotStore = errors.New("not a backstop store")

// SQLite's result codes that explainOpen explains.
const (
	sqliteCantOpen = 14 // SQLITE_CANTOPEN: unable to open database file
	sqliteNotADB   = 26 // SQLITE_NOTADB: file is not a database
)

// checkOwner refuses a database that holds tables but no schema_migrations
// of backstop's (version, name, applied_at): another application's, which
// a wrong store path must not fill with backstop's tables, and a file that
// is not SQLite at all. An empty file is a new store. It only reads.
func (db *DB) checkOwner(ctx context.Context) error {
	// One statement, so that both are read from one snapshot while another
	// process may be creating the store.
	var row struct {
		Cols   sql.NullString `db:"cols"`
		Tables sql.NullString `db:"tables"`
	}
	if err := db.w.GetContext(ctx, &row, `SELECT
		(SELECT group_concat(name, ', ') FROM pragma_table_info('schema_migrations')) AS cols,
		(SELECT group_concat(name, ', ') FROM (SELECT name FROM sqlite_schema
			WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name LIMIT 4)) AS tables`); err != nil {
		return fmt.Errorf("read schema: %w", explainOpen(db.path, err))
	}
	if row.Cols.Valid {
		cols := strings.Split(row.Cols.String, ", ")
		for _, want := range []string{"version", "name", "applied_at"} {
			if !slices.Contains(cols, want) {
				return fmt.Errorf("%w: its schema_migrations (%s) is another tool's, not backstop's (version, name, applied_at); nothing was changed; check the store path",
					ErrNotStore, row.Cols.String)
			}
		}
		return nil
	}
	if !row.Tables.Valid {
		return nil
	}
	tables := strings.Split(row.Tables.String, ", ")
	list := strings.Join(tables[:min(len(tables), 3)], ", ")
	if len(tables) > 3 {
		list += ", …"
	}
	return fmt.Errorf("%w: the database holds another application's tables (%s) and no schema_migrations; nothing was changed; check the store path",
		ErrNotStore, list)
}

// explainOpen returns err, the failure to open or first read the store at
// path, saying what to check where SQLite's own words do not: a file that
// is not a database (an ErrNotStore), and one that cannot be opened, whose
// cause is as often the directory, in which SQLite must create the -wal
// and -shm files, as the file itself.
func explainOpen(path string, err error) error {
	se := (*sqlite.Error)(nil)
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqliteNotADB:
		return fmt.Errorf("%w: the file is not an SQLite database (%v); check the store path", ErrNotStore, err)
	case sqliteCantOpen:
		return fmt.Errorf("%w: SQLite opens the file for reading and writing and creates %s and %s beside it: check that this user can write to the directory %s and to the files in it",
			err, filepath.Base(path)+"-wal", filepath.Base(path)+"-shm", filepath.Dir(path))
	}
	return err
}

// setWAL switches the file to WAL mode (a new file, or one made by a
// version that did not), which lasts; a file already in WAL mode is left
// as it is. Where SQLite keeps another mode (it cannot share memory
// there), the store runs in that mode rather than not at all.
func (db *DB) setWAL(ctx context.Context) error {
	var mode string
	if err := db.w.GetContext(ctx, &mode, `PRAGMA journal_mode = WAL`); err != nil {
		return fmt.Errorf("set WAL mode: %w", err)
	}
	return nil
}

// migrate applies, in order, each embedded migration that schema_migrations
// does not list, each in its own immediate transaction, so that two processes
// opening one new file do not both apply it. An up-to-date store is only
// read.
func (db *DB) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	if _, err := db.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER NOT NULL PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TEXT NOT NULL
	)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var latest int
	if err := db.w.GetContext(ctx, &latest, `SELECT coalesce(max(version), 0) FROM schema_migrations`); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if n := len(ms); n > 0 && latest > ms[n-1].version {
		return fmt.Errorf("schema version %d is newer than this binary's %d", latest, ms[n-1].version)
	}
	// Only a missing migration takes the write lock (apply checks again
	// under it): an up-to-date store opens beside another process's long
	// write, such as a VACUUM.
	var applied []int
	if err := db.w.SelectContext(ctx, &applied, `SELECT version FROM schema_migrations`); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	// A version this binary does not know, below its latest, is one a
	// build that skipped it applied (a development build): its tables
	// would go unused or be migrated again under another meaning.
	for _, v := range applied {
		if !slices.ContainsFunc(ms, func(m migration) bool { return m.version == v }) {
			return fmt.Errorf("schema version %d is applied to the store but unknown to this binary: open it with the backstop that applied it", v)
		}
	}
	for _, m := range ms {
		if slices.Contains(applied, m.version) {
			continue
		}
		if err := db.apply(ctx, m); err != nil {
			return fmt.Errorf("migration %s: %w", m.name, err)
		}
	}
	return nil
}

// apply runs m unless it has already run.
func (db *DB) apply(ctx context.Context, m migration) error {
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.GetContext(ctx, &n, `SELECT count(*) FROM schema_migrations WHERE version = ?`, m.version); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, m.sql); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
		m.version, m.name, backstop.CanonicalTime(db.now())); err != nil {
		return err
	}
	return tx.Commit()
}

// retryBusy runs fn until it does not fail with SQLITE_BUSY, for at most
// limit, pausing a little between tries.
func retryBusy(ctx context.Context, limit time.Duration, fn func() error) error {
	deadline := time.Now().Add(limit)
	pause := 5 * time.Millisecond
	for {
		err := fn()
		if err == nil || !isBusy(err) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// isBusy reports whether err is SQLite's "database is locked".
func isBusy(err error) bool {
	return strings.Contains(err.Error(), "SQLITE_BUSY") || strings.Contains(err.Error(), "database is locked")
}
