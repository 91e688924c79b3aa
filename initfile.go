package idem

// The file's format on open: a new file's buckets, the format version check,
// and the migration of a file of an older version.

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/bbolt"
)

// initFile creates the engine's buckets in a new file, or checks the format
// version of an existing one. A read-only open only checks, and refuses a file
// that lacks the engine's buckets.
func initFile(db *bbolt.DB, readOnly bool) error {
	if readOnly {
		return db.View(func(tx *bbolt.Tx) error {
			root := tx.Bucket(rootName)
			if err := checkMeta(root); err != nil {
				return err
			}
			for _, name := range [][]byte{outboxName, deadName} {
				if root.Bucket(name) == nil {
					return fmt.Errorf("%w: bucket %q has no %q bucket", ErrFormat, rootName, name)
				}
			}
			return nil
		})
	}
	return db.Update(func(tx *bbolt.Tx) error {
		root := tx.Bucket(rootName)
		if root == nil {
			var err error
			if root, err = tx.CreateBucket(rootName); err != nil {
				return err
			}
			meta, err := root.CreateBucket(metaName)
			if err != nil {
				return err
			}
			if err := meta.Put(versionKey, binary.BigEndian.AppendUint32(nil, formatVersion)); err != nil {
				return err
			}
			if err := putJournalMeta(tx, newJournalID(), 0); err != nil {
				return err
			}
		}
		if err := checkMeta(root); err != nil {
			return err
		}
		for _, name := range [][]byte{outboxName, deadName} {
			if _, err := root.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return migrate(tx, root)
	})
}

// migrate brings a file of an older format version to formatVersion, in the
// transaction that opens it. From version 1: its records stay as they are
// (version-1 record values decode, with their slot's width as their window
// and started ones kept until resolved), and only the version changes, so
// that a build of version 1, which would misjudge records of version 2,
// refuses the file. To version 3: the journal meta (a new journal id, the
// checkpoint at 0); its version-1 messages decode. So a build of version 2,
// which would not replay the journal and would quarantine messages of
// encoding version 2 as corrupt, refuses the file. To version 4: nothing but
// the version, so that a build of version 3, which would take the journal's
// DoTx frames for damage, refuses the file.
func migrate(tx *bbolt.Tx, root *bbolt.Bucket) error {
	meta := root.Bucket(metaName)
	if binary.BigEndian.Uint32(meta.Get(versionKey)) == formatVersion {
		return nil
	}
	if meta.Get(journalKey) == nil {
		if err := putJournalMeta(tx, newJournalID(), 0); err != nil {
			return err
		}
	}
	return meta.Put(versionKey, binary.BigEndian.AppendUint32(nil, formatVersion))
}

// checkMeta checks the format version in root's meta bucket.
func checkMeta(root *bbolt.Bucket) error {
	if root == nil {
		return fmt.Errorf("%w: not an idem file (no %q bucket)", ErrFormat, rootName)
	}
	meta := root.Bucket(metaName)
	if meta == nil {
		return fmt.Errorf("%w: bucket %q has no meta bucket", ErrFormat, rootName)
	}
	v := meta.Get(versionKey)
	if len(v) != 4 {
		return fmt.Errorf("%w: no format version recorded", ErrFormat)
	}
	if got := binary.BigEndian.Uint32(v); got < oldestFormatVersion || got > formatVersion {
		return fmt.Errorf("%w: file has format version %d, this build reads versions %d to %d", ErrFormat, got, oldestFormatVersion, formatVersion)
	}
	return nil
}
