package taubench

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

// The bbolt buckets of the retail database. The record buckets map a record
// id to its JSON text, written as the reference's json.dumps writes it (so a
// read tool answers with the stored bytes). The order buckets map a 4-byte
// big-endian position to a record id and keep the data files' order, which
// bbolt's sorted keys lose: the reference scans users in file order ("the
// first user whose …"), and product names resolve duplicates in file order.
const (
	OrdersBucket       = "tau_orders"
	UsersBucket        = "tau_users"
	ProductsBucket     = "tau_products"
	UserOrderBucket    = "tau_user_order"
	ProductOrderBucket = "tau_product_order"
)

// Buckets is what BoltStore needs from a bbolt transaction: named top-level
// buckets, created on first use. IdemTx adapts a DoTx's *idem.Tx; BoltTx a
// plain *bbolt.Tx.
type Buckets interface {
	Bucket(name []byte) (Bucket, error)
}

// Bucket is what BoltStore needs from a bucket: *bbolt.Bucket and
// *idem.Bucket both have it.
type Bucket interface {
	Get(key []byte) []byte
	Put(key, value []byte) error
	ForEach(fn func(k, v []byte) error) error
}

// IdemTx adapts a DoTx's *idem.Tx to Buckets.
type IdemTx struct {
	*idem.Tx
}

// Bucket returns the top-level bucket name, created if need be.
func (t IdemTx) Bucket(name []byte) (Bucket, error) {
	b, err := t.Tx.Bucket(name)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// BoltTx adapts a *bbolt.Tx to Buckets. In a writable transaction a missing
// bucket is created; in a read-only one it is an error.
type BoltTx struct {
	*bbolt.Tx
}

// Bucket returns the top-level bucket name.
func (t BoltTx) Bucket(name []byte) (Bucket, error) {
	if t.Writable() {
		b, err := t.CreateBucketIfNotExists(name)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	if b := t.Tx.Bucket(name); b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("taubench: no bucket %q (is the database seeded?)", name)
}

// table is one table of the retail database.
type table struct {
	name   string // the key of Task.Changed
	bucket string
	file   string
	order  string // bucket of the file-order index, "" if nothing needs it
}

var (
	ordersTable   = table{"orders", OrdersBucket, OrdersFile, ""}
	usersTable    = table{"users", UsersBucket, UsersFile, UserOrderBucket}
	productsTable = table{"products", ProductsBucket, ProductsFile, ProductOrderBucket}
	tables        = []table{ordersTable, usersTable, productsTable}
)

// record is one stored record.
type record struct {
	id   string
	json []byte // in json.dumps form
}

// Dataset is the initial retail database as read from the data files, each
// table's records in file order.
type Dataset struct {
	records map[string][]record // by table name
}

// LoadDataset reads orders.json, users.json and products.json from dir.
func LoadDataset(dir string) (*Dataset, error) {
	d := &Dataset{records: map[string][]record{}}
	for _, t := range tables {
		path := filepath.Join(dir, t.file)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		root, err := parseObject(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		recs := make([]record, len(root.keys))
		for i, id := range root.keys {
			if _, ok := root.vals[i].(*object); !ok || id == "" {
				return nil, fmt.Errorf("%s: record %q is not a JSON object with an id", path, id)
			}
			recs[i] = record{id: id, json: dumps(root.vals[i])}
		}
		d.records[t.name] = recs
	}
	return d, nil
}

// Put writes the dataset into the buckets, which should be empty.
func (d *Dataset) Put(b Buckets) error {
	for _, t := range tables {
		bkt, err := b.Bucket([]byte(t.bucket))
		if err != nil {
			return err
		}
		var idx Bucket
		if t.order != "" {
			if idx, err = b.Bucket([]byte(t.order)); err != nil {
				return err
			}
		}
		for i, r := range d.records[t.name] {
			if err := bkt.Put([]byte(r.id), r.json); err != nil {
				return err
			}
			if idx != nil {
				if err := idx.Put(binary.BigEndian.AppendUint32(nil, uint32(i)), []byte(r.id)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Seed loads the retail data files of dir into db in one transaction,
// replacing whatever the retail buckets held.
func Seed(db *bbolt.DB, dir string) error {
	d, err := LoadDataset(dir)
	if err != nil {
		return err
	}
	return db.Update(func(tx *bbolt.Tx) error {
		for _, t := range tables {
			for _, name := range []string{t.bucket, t.order} {
				if name != "" && tx.Bucket([]byte(name)) != nil {
					if err := tx.DeleteBucket([]byte(name)); err != nil {
						return err
					}
				}
			}
		}
		return d.Put(BoltTx{tx})
	})
}

// snapshot is the content of the retail tables: table name ("orders",
// "users", "products", as in Task.Changed) → record id → record JSON.
type snapshot map[string]map[string]json.RawMessage

// Snapshot reads every record of the retail tables, for comparison with
// DiffChanged.
func Snapshot(s Store) (snapshot, error) {
	snap := snapshot{}
	for _, t := range tables {
		recs := map[string]json.RawMessage{}
		err := s.Scan(t.name, func(id string, data []byte) (bool, error) {
			recs[id] = append(json.RawMessage(nil), data...)
			return true, nil
		})
		if err != nil {
			return nil, err
		}
		snap[t.name] = recs
	}
	return snap, nil
}

// Store is the retail database as a tool reads and writes it, inside one
// transaction of its backend: the bbolt buckets (BoltStore) or the Postgres
// tables of one schema (PgStore). Tables are named as in Task.Changed:
// "orders", "users", "products". A record is its JSON text in json.dumps
// form, so that a read tool answers with the stored bytes.
type Store interface {
	// Record returns the JSON text of record id of table, or nil if there
	// is none. The slice is only valid during the transaction.
	Record(table, id string) ([]byte, error)
	// Put stores data as record id of table, replacing what was there.
	Put(table, id string, data []byte) error
	// Scan calls fn on every record of table in data-file order (the order
	// the reference's dicts keep: "the first user whose …") until fn
	// returns false or an error, which Scan returns. data is only valid
	// during fn.
	Scan(table string, fn func(id string, data []byte) (bool, error)) error
}

// BoltStore is the Store of a bbolt transaction: each table a bucket, with
// an index bucket of file positions where the order matters.
type BoltStore struct {
	// B is the transaction's buckets: *idem.Tx, or BoltTx{tx}.
	B Buckets
}

// boltTable returns the table called name.
func boltTable(name string) (table, error) {
	for _, t := range tables {
		if t.name == name {
			return t, nil
		}
	}
	return table{}, fmt.Errorf("taubench: no table %q", name)
}

// Record implements Store.
func (s BoltStore) Record(name, id string) ([]byte, error) {
	t, err := boltTable(name)
	if err != nil {
		return nil, err
	}
	bkt, err := s.B.Bucket([]byte(t.bucket))
	if err != nil || id == "" {
		return nil, err
	}
	return bkt.Get([]byte(id)), nil
}

// Put implements Store.
func (s BoltStore) Put(name, id string, data []byte) error {
	t, err := boltTable(name)
	if err != nil {
		return err
	}
	bkt, err := s.B.Bucket([]byte(t.bucket))
	if err != nil {
		return err
	}
	return bkt.Put([]byte(id), data)
}

// Scan implements Store. Without an order index it falls back to key order.
func (s BoltStore) Scan(name string, fn func(id string, data []byte) (bool, error)) error {
	t, err := boltTable(name)
	if err != nil {
		return err
	}
	bkt, err := s.B.Bucket([]byte(t.bucket))
	if err != nil {
		return err
	}
	walk, viaIndex := bkt, false
	if t.order != "" {
		idx, err := s.B.Bucket([]byte(t.order))
		if err != nil {
			return err
		}
		if err := idx.ForEach(func(_, _ []byte) error { return errStopScan }); err == errStopScan {
			walk, viaIndex = idx, true
		}
	}
	err = walk.ForEach(func(k, v []byte) error {
		id, data := k, v
		if viaIndex {
			id, data = v, bkt.Get(v)
			if data == nil {
				return nil
			}
		}
		more, err := fn(string(id), data)
		if err != nil {
			return err
		}
		if !more {
			return errStopScan
		}
		return nil
	})
	if err == errStopScan {
		return nil
	}
	return err
}

// errStopScan ends a ForEach early; Scan never returns it.
var errStopScan = errors.New("taubench: scan stopped")

// getRaw returns the stored JSON of record id of t, or nil if there is none.
// The slice is only valid during the transaction.
func getRaw(s Store, t table, id string) ([]byte, error) {
	if id == "" {
		return nil, nil
	}
	return s.Record(t.name, id)
}

// getRecord decodes record id of t, or returns nil if there is none.
func getRecord(s Store, t table, id string) (*object, error) {
	data, err := getRaw(s, t, id)
	if err != nil || data == nil {
		return nil, err
	}
	o, err := parseObject(data)
	if err != nil {
		return nil, fmt.Errorf("taubench: %s record %q: %w", t.name, id, err)
	}
	return o, nil
}

// putRecord stores record id of t and returns its JSON text.
func putRecord(s Store, t table, id string, o *object) (string, error) {
	data := dumps(o)
	if err := s.Put(t.name, id, data); err != nil {
		return "", err
	}
	return string(data), nil
}

// forEachInFileOrder calls fn on the records of t in data-file order until fn
// returns false.
func forEachInFileOrder(s Store, t table, fn func(id string, rec *object) bool) error {
	return s.Scan(t.name, func(id string, data []byte) (bool, error) {
		rec, err := parseObject(data)
		if err != nil {
			return false, fmt.Errorf("taubench: %s record %q: %w", t.name, id, err)
		}
		return fn(id, rec), nil
	})
}
