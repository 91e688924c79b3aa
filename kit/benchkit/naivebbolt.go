package benchkit

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"go.etcd.io/bbolt"
)

// NaiveBbolt is the engine one writes first with bbolt: one Update writes the
// started record, fn runs, one more Update writes the done record. A replay is
// a View and a Get. Expiry is an index bucket keyed by expiry time, pruned in
// transactions of 1,000 deletes. No group commit, no cache.
//
// Its figures are also floors for idem: its replay is a bare read transaction
// and Get, its first execution two bare commits, its DoTx one.
type NaiveBbolt struct {
	db *bbolt.DB
}

var (
	naiveRecords = []byte("records")
	naiveExpiry  = []byte("expiry")
	naiveEffects = []byte("effects")
)

// Record states of the naive engine.
const (
	naiveStarted byte = 0
	naiveDone    byte = 1
)

// naivePruneBatch is the number of expired records deleted per transaction.
const naivePruneBatch = 1000

// OpenNaiveBbolt opens a naive bbolt engine in dir/naive.db, with bbolt's
// default options (fsync on every commit).
func OpenNaiveBbolt(_ context.Context, dir string) (Deduper, error) {
	db, err := bbolt.Open(filepath.Join(dir, "naive.db"), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("naive-bbolt: %w", err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{naiveRecords, naiveExpiry, naiveEffects} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("naive-bbolt: %w", err), db.Close())
	}
	return &NaiveBbolt{db: db}, nil
}

// Name implements Deduper.
func (n *NaiveBbolt) Name() string { return "naive-bbolt" }

// Close closes the file.
func (n *NaiveBbolt) Close() error { return n.db.Close() }

// A naive record is state (1 byte), expiry (Unix nanoseconds, 8 bytes big
// endian), the fingerprint's length (1 byte), the fingerprint, the response.
func encodeNaive(state byte, expires int64, fp, resp []byte) []byte {
	b := make([]byte, 0, 10+len(fp)+len(resp))
	b = append(b, state)
	b = binary.BigEndian.AppendUint64(b, uint64(expires))
	b = append(b, byte(len(fp)))
	b = append(b, fp...)
	return append(b, resp...)
}

type naiveRecord struct {
	state    byte
	expires  int64
	fp, resp []byte // point into the mmap: copy before the transaction ends
}

func decodeNaive(v []byte) (naiveRecord, error) {
	if len(v) < 10 || len(v) < 10+int(v[9]) {
		return naiveRecord{}, errors.New("naive-bbolt: corrupt record")
	}
	n := 10 + int(v[9])
	return naiveRecord{state: v[0], expires: int64(binary.BigEndian.Uint64(v[1:9])), fp: v[10:n], resp: v[n:]}, nil
}

func expiryKey(expires int64, key []byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(key)), uint64(expires)), key...)
}

// answer is the outcome of finding a live record: its response (copied) for a
// done record, or the error that refuses the call.
func answer(r naiveRecord, fp []byte) ([]byte, error) {
	switch {
	case !bytes.Equal(r.fp, fp):
		return nil, ErrConflict
	case r.state != naiveDone:
		return nil, ErrInProgress
	}
	return bytes.Clone(r.resp), nil
}

// lookup answers key from a live record, if there is one.
func (n *NaiveBbolt) lookup(key string, fp []byte) (resp []byte, found bool, err error) {
	err = n.db.View(func(tx *bbolt.Tx) error {
		resp, found, err = n.find(tx, []byte(key), fp, time.Now().UnixNano())
		return err
	})
	return resp, found, err
}

// find answers key from a live record in tx, if there is one.
func (n *NaiveBbolt) find(tx *bbolt.Tx, key, fp []byte, now int64) (resp []byte, found bool, err error) {
	v := tx.Bucket(naiveRecords).Get(key)
	if v == nil {
		return nil, false, nil
	}
	r, err := decodeNaive(v)
	if err != nil || r.expires <= now {
		return nil, false, err
	}
	resp, err = answer(r, fp)
	return resp, true, err
}

// put writes a record and its expiry index entry in tx, dropping the index
// entry of the record it replaces.
func (n *NaiveBbolt) put(tx *bbolt.Tx, key []byte, state byte, expires int64, fp, resp []byte) error {
	recs, idx := tx.Bucket(naiveRecords), tx.Bucket(naiveExpiry)
	if old := recs.Get(key); old != nil {
		if r, err := decodeNaive(old); err == nil {
			if err := idx.Delete(expiryKey(r.expires, key)); err != nil {
				return err
			}
		}
	}
	if err := recs.Put(key, encodeNaive(state, expires, fp, resp)); err != nil {
		return err
	}
	return idx.Put(expiryKey(expires, key), nil)
}

// remove deletes key's record and its index entry in tx.
func (n *NaiveBbolt) remove(tx *bbolt.Tx, key []byte) error {
	recs := tx.Bucket(naiveRecords)
	if old := recs.Get(key); old != nil {
		if r, err := decodeNaive(old); err == nil {
			if err := tx.Bucket(naiveExpiry).Delete(expiryKey(r.expires, key)); err != nil {
				return err
			}
		}
	}
	return recs.Delete(key)
}

// Do answers from a live record (View + Get), or claims the key with a
// started record (Update), runs fn, and records the outcome (Update). An error
// from fn deletes the started record: the key is free again.
func (n *NaiveBbolt) Do(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) ([]byte, bool, error) {
	if resp, found, err := n.lookup(key, fp); found || err != nil {
		return resp, err == nil, err
	}
	k := []byte(key)
	var (
		resp  []byte
		found bool
	)
	err := n.db.Update(func(tx *bbolt.Tx) error {
		now := time.Now()
		var err error
		if resp, found, err = n.find(tx, k, fp, now.UnixNano()); found || err != nil {
			return err
		}
		return n.put(tx, k, naiveStarted, now.Add(Retention).UnixNano(), fp, nil)
	})
	if found || err != nil {
		return resp, err == nil, err
	}
	resp, ferr := fn(ctx)
	if ferr != nil {
		return nil, false, errors.Join(ferr, n.db.Update(func(tx *bbolt.Tx) error { return n.remove(tx, k) }))
	}
	err = n.db.Update(func(tx *bbolt.Tx) error {
		return n.put(tx, k, naiveDone, time.Now().Add(Retention).UnixNano(), fp, resp)
	})
	return resp, false, err
}

// DoTx answers from a live record (View + Get), or runs fn inside one Update
// that writes its effect and the done record.
func (n *NaiveBbolt) DoTx(ctx context.Context, key string, fp []byte, fn TxFunc) ([]byte, bool, error) {
	if resp, found, err := n.lookup(key, fp); found || err != nil {
		return resp, err == nil, err
	}
	k := []byte(key)
	var (
		resp  []byte
		found bool
	)
	err := n.db.Update(func(tx *bbolt.Tx) error {
		now := time.Now()
		var err error
		if resp, found, err = n.find(tx, k, fp, now.UnixNano()); found || err != nil {
			return err
		}
		eff, r, err := fn(ctx)
		if err != nil {
			return err
		}
		resp = r
		if err := tx.Bucket(naiveEffects).Put(eff.Key, eff.Value); err != nil {
			return err
		}
		return n.put(tx, k, naiveDone, now.Add(Retention).UnixNano(), fp, resp)
	})
	if err != nil {
		return nil, false, err
	}
	return resp, found, nil
}

// Preload writes rs in one Update per 10,000 records, keys sorted, without
// fsync until the end.
func (n *NaiveBbolt) Preload(ctx context.Context, rs RecordSet) error {
	n.db.NoSync = true
	defer func() { n.db.NoSync = false }()
	expires := rs.Completed.Add(Retention).UnixNano()
	const batch = 10_000
	for off := 0; off < rs.N; off += batch {
		if err := ctx.Err(); err != nil {
			return err
		}
		ks := SortedKeys(rs.First+off, min(batch, rs.N-off))
		err := n.db.Update(func(tx *bbolt.Tx) error {
			recs, ix := tx.Bucket(naiveRecords), tx.Bucket(naiveExpiry)
			for _, r := range ks {
				if err := recs.Put([]byte(r.Key), encodeNaive(naiveDone, expires, Fingerprint(r.Index), response)); err != nil {
					return err
				}
				if err := ix.Put(expiryKey(expires, []byte(r.Key)), nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return n.db.Sync()
}

// Prune deletes expired records through the expiry index, in transactions of
// naivePruneBatch.
func (n *NaiveBbolt) Prune(ctx context.Context) (int, error) {
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		deleted := 0
		err := n.db.Update(func(tx *bbolt.Tx) error {
			recs, idx := tx.Bucket(naiveRecords), tx.Bucket(naiveExpiry)
			now := uint64(time.Now().UnixNano())
			var due [][]byte
			c := idx.Cursor()
			for k, _ := c.First(); k != nil && len(due) < naivePruneBatch; k, _ = c.Next() {
				if len(k) < 8 || binary.BigEndian.Uint64(k) > now {
					break
				}
				due = append(due, bytes.Clone(k))
			}
			for _, ik := range due {
				if err := idx.Delete(ik); err != nil {
					return err
				}
				if err := recs.Delete(ik[8:]); err != nil {
					return err
				}
				deleted++
			}
			return nil
		})
		total += deleted
		if err != nil || deleted < naivePruneBatch {
			return total, err
		}
	}
}
