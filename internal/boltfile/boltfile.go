// Package boltfile opens bbolt files so that damage is an error, never a
// crash or a leak:
//
//   - Before bbolt maps a file, CheckMeta reads its two meta pages with plain
//     reads. bbolt maps the whole file and trusts the meta page's high water
//     mark: on a file truncated below it, a read of a page past the end faults
//     (SIGBUS), which no recover catches; bbolt's consistency check runs on a
//     goroutine of its own, so even debug.SetPanicOnFault cannot help.
//   - Open keeps the *os.File that bbolt opens (bbolt v1.5.0's
//     Options.OpenFile), so that when bbolt panics on a damaged page after it
//     took the file lock, the lock is released and the descriptor closed: the
//     recovered panic yields no *bbolt.DB to close.
//
// The layout read here is bbolt's (v1.5.0, internal/common): a page starts
// with a 16-byte header (id u64, flags u16, count u16, overflow u32); a meta
// page's body is magic u32, version u32, page size u32, flags u32, root bucket
// (page u64, sequence u64), freelist page u64, high water mark u64 (the number
// of pages in use), txid u64, checksum u64 (FNV-64a of the fields before it),
// in the machine's byte order.
package boltfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// ErrDamaged is wrapped by every error that reports a damaged file: meta
// pages that contradict the file (a truncation), or a panic of bbolt's while
// it opened the file.
var ErrDamaged = errors.New("the file is damaged")

const (
	magic      = 0xED0CDAED // bbolt's common.Magic
	version    = 2          // bbolt's common.Version
	noFreelist = ^uint64(0) // bbolt's common.PgidNoFreelist
	// metaOff and metaEnd bound a meta page's fields (after the page
	// header), checksum included.
	metaOff, metaEnd = 16, 16 + 64
	// firstMetaBuf is how much of page 0 bbolt reads for its page size.
	firstMetaBuf = 0x1000
	// minPageSize and maxPageSize bound the page sizes bbolt tries when it
	// looks for page 1.
	minPageSize, maxPageSize = 1 << 10, 1 << 16
	// headerSize is a page header's.
	headerSize = 16
)

// meta is a decoded meta page.
type meta struct {
	pageSize, flags            uint32
	root, freelist, pgid, txid uint64
	// err is nil when magic, version and checksum hold, else bbolt's
	// errors.ErrInvalid (no magic number, or cut short), ErrVersionMismatch
	// or ErrChecksum.
	err error
}

func (m meta) valid() bool { return m.err == nil }

func decodeMeta(p []byte) meta {
	if len(p) < metaEnd {
		return meta{err: bolterrors.ErrInvalid}
	}
	ne := binary.NativeEndian
	b := p[metaOff:metaEnd]
	m := meta{
		pageSize: ne.Uint32(b[8:]), flags: ne.Uint32(b[12:]),
		root: ne.Uint64(b[16:]), freelist: ne.Uint64(b[32:]), pgid: ne.Uint64(b[40:]), txid: ne.Uint64(b[48:]),
	}
	h := fnv.New64a()
	_, _ = h.Write(b[:56])
	switch {
	case ne.Uint32(b) != magic:
		m.err = bolterrors.ErrInvalid
	case ne.Uint32(b[4:]) != version:
		m.err = fmt.Errorf("%w: bbolt format version %d", bolterrors.ErrVersionMismatch, ne.Uint32(b[4:]))
	case ne.Uint64(b[56:]) != h.Sum64():
		m.err = bolterrors.ErrChecksum
	}
	return m
}

// CheckMeta reads the meta pages of f (size bytes long) as bbolt will, and
// reports a file that bbolt must not map: one that is not a bbolt file (an
// error wrapping bbolt's errors.ErrInvalid or ErrVersionMismatch), or whose
// meta pages claim pages past the file's end or are cut (wrapping
// ErrDamaged). An empty file passes: bbolt initialises it.
func CheckMeta(f io.ReaderAt, size int64) error {
	if size == 0 {
		return nil
	}
	page0 := make([]byte, firstMetaBuf)
	n, err := f.ReadAt(page0, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	m0 := decodeMeta(page0[:n])
	pageSize := int64(0)
	if m0.valid() {
		pageSize = int64(m0.pageSize)
	}
	var m1 meta
	if pageSize == 0 {
		// Page 0 is unreadable: find page 1 at each page size bbolt tries.
		for ps := int64(minPageSize); ps <= maxPageSize; ps *= 2 {
			if m := readMeta(f, ps, size); m.valid() && int64(m.pageSize) == ps {
				pageSize, m1 = ps, m
				break
			}
		}
	} else {
		m1 = readMeta(f, pageSize, size)
	}
	if pageSize == 0 {
		switch {
		case errors.Is(m0.err, bolterrors.ErrChecksum):
			return fmt.Errorf("%w: both meta pages are invalid (page 0: %v)", ErrDamaged, m0.err)
		case errors.Is(m0.err, bolterrors.ErrVersionMismatch):
			return m0.err
		case size < metaEnd:
			return fmt.Errorf("%w: %d bytes is too short for a bbolt file", bolterrors.ErrInvalid, size)
		}
		return fmt.Errorf("%w: not a bbolt file", bolterrors.ErrInvalid)
	}
	if pageSize < minPageSize || pageSize > 1<<30 || pageSize&(pageSize-1) != 0 {
		return fmt.Errorf("%w: page size %d", ErrDamaged, pageSize)
	}
	if size < 2*pageSize {
		return fmt.Errorf("%w: truncated to %d bytes, less than its two meta pages of %d bytes", ErrDamaged, size, pageSize)
	}
	for i, m := range []meta{m0, m1} {
		if !m.valid() {
			continue // a torn meta page: bbolt uses the other one
		}
		if int64(m.pageSize) != pageSize {
			return fmt.Errorf("%w: meta page %d says page size %d, page %d says %d", ErrDamaged, i, m.pageSize, 1-i, pageSize)
		}
		if m.pgid < 2 || m.pgid > uint64(size/pageSize) {
			return fmt.Errorf("%w: truncated: meta page %d counts %d pages of %d bytes (%d bytes), the file has %d bytes",
				ErrDamaged, i, m.pgid, pageSize, m.pgid*uint64(pageSize), size)
		}
		if m.root < 2 || m.root >= m.pgid || (m.freelist != noFreelist && (m.freelist < 2 || m.freelist >= m.pgid)) {
			return fmt.Errorf("%w: meta page %d points past its %d pages (root %d, freelist %d)", ErrDamaged, i, m.pgid, m.root, m.freelist)
		}
	}
	// bbolt.Open reads the freelist of the meta page it uses (the valid one
	// of the higher txid) through the map: its length must stay in its pages.
	m := m0
	if !m.valid() || (m1.valid() && m1.txid > m0.txid) {
		m = m1
	}
	if m.freelist != noFreelist {
		return checkFreelist(f, m, pageSize)
	}
	return nil
}

// freelistPageFlag is bbolt's common.FreelistPageFlag.
const freelistPageFlag = 0x10

// checkFreelist checks that the freelist page of m, read the way bbolt reads
// it (a count in the page header, or, at 0xFFFF, in the first element), ends
// inside its overflow pages, and those inside the pages in use. A page of
// another type is left to bbolt, which refuses it with a panic (that Open
// recovers), not a fault.
func checkFreelist(f io.ReaderAt, m meta, pageSize int64) error {
	var h [headerSize + 8]byte
	if _, err := f.ReadAt(h[:], int64(m.freelist)*pageSize); err != nil {
		return fmt.Errorf("%w: freelist page %d: %v", ErrDamaged, m.freelist, err)
	}
	ne := binary.NativeEndian
	if ne.Uint16(h[8:]) != freelistPageFlag {
		return nil
	}
	count, overflow := uint64(ne.Uint16(h[10:])), uint64(ne.Uint32(h[12:]))
	size := headerSize + 8*count
	if count == 0xFFFF {
		count = ne.Uint64(h[headerSize:])
		size = headerSize + 8 + 8*count
	}
	if m.freelist+overflow >= m.pgid || count > uint64(m.pgid) || size > (overflow+1)*uint64(pageSize) {
		return fmt.Errorf("%w: freelist page %d: %d free pages in %d overflow pages, of %d pages in use", ErrDamaged, m.freelist, count, overflow, m.pgid)
	}
	return nil
}

// readMeta reads and decodes the meta page at page 1 for page size ps.
func readMeta(f io.ReaderAt, ps, size int64) meta {
	if size < ps+metaEnd {
		return meta{err: bolterrors.ErrInvalid}
	}
	b := make([]byte, metaEnd)
	if _, err := f.ReadAt(b, ps); err != nil {
		return meta{err: err}
	}
	return decodeMeta(b)
}

// CheckFile is CheckMeta on the file at path. A missing file passes (bbolt
// creates it, or reports it).
func CheckFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return CheckMeta(f, fi.Size())
}

// Open is bbolt.Open after CheckFile, with bbolt's panics on a damaged file
// turned into an error wrapping ErrDamaged, after which the file is unlocked
// and closed (the memory map bbolt made, if any, stays: bbolt holds its only
// reference). o may be nil; its OpenFile, if set, is used to open the file.
func Open(path string, mode os.FileMode, o *bbolt.Options) (db *bbolt.DB, err error) {
	if err := CheckFile(path); err != nil {
		return nil, err
	}
	var opts bbolt.Options
	if o != nil {
		opts = *o
	} else {
		opts = *bbolt.DefaultOptions
	}
	openFile := opts.OpenFile
	if openFile == nil {
		openFile = os.OpenFile
	}
	var file *os.File
	opts.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := openFile(name, flag, perm)
		file = f
		return f, err
	}
	defer func() {
		if v := recover(); v != nil {
			if file != nil {
				unlock(file)
				_ = file.Close()
			}
			db, err = nil, fmt.Errorf("%w (bbolt: %v)", ErrDamaged, v)
		}
	}()
	return bbolt.Open(path, mode, &opts)
}
