package store

import (
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// lockHeld is Cause's phrase for SQLITE_BUSY and SQLITE_LOCKED.
const lockHeld = "another process holds the store's write lock"

// LockHeld reports whether err is the store's write lock held by another
// connection past the busy timeout: a passing condition, unlike the
// others Cause names.
func LockHeld(err error) bool {
	c := Cause(err)
	return c == lockHeld || c == writerBusy
}

// writerBusy is Cause's phrase for ErrWriterBusy.
const writerBusy = "the store's writes are waiting for its write lock (another process may hold it)"

// Damaged reports whether err says the store file is damaged (SQLite's
// SQLITE_CORRUPT or SQLITE_NOTADB): unlike a full disk or a lock held
// elsewhere, that does not pass; the store needs repair or a restore.
func Damaged(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code() & 0xff
	return c == sqlite3.SQLITE_CORRUPT || c == sqlite3.SQLITE_NOTADB
}

// Cause names, in a few words fit to show outside the process, why the
// store refused an operation: "the disk is full", "the store file is
// read-only", and so on. It never includes the store's path or the
// driver's message, which belong in the log. It returns "" when err is not
// one of the conditions it knows.
func Cause(err error) string {
	if errors.Is(err, errDiskLow) {
		return "the disk is full"
	}
	if errors.Is(err, ErrWriterBusy) {
		return writerBusy
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return ""
	}
	switch se.Code() & 0xff { // the primary result code of an extended one
	case sqlite3.SQLITE_FULL:
		return "the disk is full"
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM:
		return "the store file cannot be written"
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return lockHeld
	case sqlite3.SQLITE_IOERR:
		return "the disk reported an I/O error"
	case sqlite3.SQLITE_CORRUPT:
		return "the store file is damaged"
	case sqlite3.SQLITE_NOTADB:
		// As Open says (ErrNotStore): a wrong path as often as a damaged file.
		return "the store file is damaged, or not a backstop store"
	case sqlite3.SQLITE_CANTOPEN:
		return "the store file cannot be opened"
	}
	return ""
}
