package idem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"go.etcd.io/bbolt"
)

// Replay: what Open reads back from the journal. The frames after the
// checkpoint, from checkpoint+1 on, one more each, wherever they sit in the
// segments, are the writes bbolt may lack; replay applies them to bbolt in
// one transaction with the checkpoint at the last (a read-only open puts them
// in the overlay instead). Applying a frame twice gives the file it gave once
// (puts and deletes of whole values, buckets made if missing), so a replay
// cut short is replayed again.
//
// Each segment is read from its start while its frames are valid and
// numbered one more each: a frame that fails its checksum (zeros, a torn
// write, another file's journal) or a number that does not follow (an old
// frame of a recycled segment: at or below the checkpoint) ends the segment.
// The first number with no frame ends replay: that frame, written last and
// never synced, is the torn tail, and its caller was never answered. But a
// frame is written only once the one before it is synced (journal.go), so a
// valid frame after the end proves the missing one was durable: damage,
// ErrCorrupt, and nothing is guessed. Replay looks for such a frame behind
// every bad one, at every 8-byte step of the segment's rest.

// jframe is one frame read back.
type jframe struct {
	seq  uint64
	muts []mutation
}

// journalScan is what replay found: the frames after the checkpoint, in
// order, and the writes they carry.
type journalScan struct {
	frames []jframe
	writes int
	held   map[*segment]uint64 // the segments holding them: their last
}

// scanJournal reads the frames after ckpt from segs.
func scanJournal(segs []*segment, salt uint32, ckpt uint64) (*journalScan, error) {
	found := make(map[uint64][]byte)
	in := make(map[uint64]*segment)
	var total int64
	for _, s := range segs {
		total += s.size
	}
	// A number beyond this is no frame of ours: garbage that happened to
	// parse, which the checksum then refutes (the bound only saves work).
	plausible := ckpt + uint64(total/frameHeader) + 1
	for _, s := range segs {
		data, err := s.read()
		if err != nil {
			return nil, fmt.Errorf("journal: segment %s: %w", s.path, err)
		}
		off, prev := 0, uint64(0)
		for {
			seq, payload, size, ok := parseFrame(data[off:], salt)
			if !ok || (prev != 0 && seq != prev+1) {
				break
			}
			if seq > ckpt {
				if err := note(found, s, seq, payload); err != nil {
					return nil, err
				}
				in[seq] = s
			}
			prev = seq
			off += size
		}
		// Behind the end: a later frame of this journal means damage.
		for at := off + frameAlign; at+frameHeader <= len(data); at += frameAlign {
			b := data[at:]
			if seq := binary.LittleEndian.Uint64(b[8:]); seq <= ckpt || seq > plausible {
				continue
			}
			if seq, payload, _, ok := parseFrame(b, salt); ok {
				if err := note(found, s, seq, payload); err != nil {
					return nil, err
				}
			}
		}
	}
	sc := &journalScan{held: make(map[*segment]uint64)}
	next := ckpt + 1
	for ; ; next++ {
		p, ok := found[next]
		if !ok {
			break
		}
		delete(found, next)
		muts, err := decodeBatch(p)
		if err != nil {
			return nil, fmt.Errorf("%w: journal frame %d: %w", ErrCorrupt, next, err)
		}
		sc.frames = append(sc.frames, jframe{seq: next, muts: muts})
		sc.writes += len(muts)
		sc.held[in[next]] = next
	}
	if len(found) > 0 {
		later := slices.Sorted(maps.Keys(found))
		return nil, fmt.Errorf("%w: journal frame %d is missing or damaged, but frame %d after it was written once it was durable; run `idem check` and restore from a backup", ErrCorrupt, next, later[0])
	}
	return sc, nil
}

// note records frame seq's payload, found in s.
func note(found map[uint64][]byte, s *segment, seq uint64, payload []byte) error {
	if old, dup := found[seq]; dup && string(old) != string(payload) {
		return fmt.Errorf("%w: journal frame %d found twice, with different writes (segment %s)", ErrCorrupt, seq, s.path)
	}
	found[seq] = payload
	return nil
}

// last is the number of the last frame found, or ckpt if none.
func (sc *journalScan) last(ckpt uint64) uint64 {
	if len(sc.frames) == 0 {
		return ckpt
	}
	return sc.frames[len(sc.frames)-1].seq
}

// openJournal replays the journal of the bbolt file at path, opened as db
// with f: into bbolt in one transaction with the checkpoint at its last
// frame (into ov, for a read-only open, which writes nothing), and logs how
// much it replayed. It returns the journal to write through, over segments
// that all hold frames the checkpoint covers, or nil when f turns it off; and
// the writes replayed.
func openJournal(path string, db *bbolt.DB, pipe *pipeline, ov *overlay, f *BoltOptions, log *slog.Logger) (*journal, int, error) {
	var (
		id, ckpt uint64
		ok       bool
	)
	if err := db.View(func(tx *bbolt.Tx) error {
		var err error
		id, ckpt, ok, err = journalMeta(tx)
		return err
	}); err != nil || !ok {
		return nil, 0, err // a file before version 3, read-only: no journal
	}
	dir := journalDir(path)
	if !f.ReadOnly && f.journalOn() {
		// Made here, not at the first write: a directory the program cannot
		// write fails Open, naming it, instead of the first Do failing the
		// engine closed.
		if err := makeJournalDir(dir); err != nil {
			return nil, 0, fmt.Errorf("journal: %w", err)
		}
	}
	segs, err := openSegments(dir, f.ReadOnly)
	if err != nil {
		return nil, 0, fmt.Errorf("journal: %w", err)
	}
	if !f.ReadOnly && f.journalOn() && len(segs) == 0 {
		s, err := createSegment(dir, 1, segmentSize)
		if err != nil {
			return nil, 0, fmt.Errorf("journal: %w", err)
		}
		segs = append(segs, s)
	}
	salt := journalSalt(id)
	sc, err := scanJournal(segs, salt, ckpt)
	if err != nil {
		closeSegments(segs)
		return nil, 0, err
	}
	last := sc.last(ckpt)
	if len(sc.frames) > 0 {
		log.Info("idem: replayed the journal", "path", dir, "frames", len(sc.frames), "writes", sc.writes, "from", ckpt+1, "to", last)
	}
	if f.ReadOnly {
		for _, fr := range sc.frames {
			ov.apply(fr.seq, fr.muts)
		}
		closeSegments(segs)
		return nil, sc.writes, nil
	}
	held := map[*segment]uint64(nil)
	// Each writable open gives the journal a new id (so a new salt): the
	// frames it writes are this open's alone. A copy of the file made
	// before (a backup, a copy while closed, idem compact's output),
	// restored later beside this journal, does not take in frames written
	// after it was made, which the writes it lacks (a Forget, DoTx's)
	// would make wrong.
	fresh := id
	if f.journalOn() {
		fresh = newJournalID()
	}
	if len(sc.frames) > 0 || fresh != id {
		err := update(db, func(tx *bbolt.Tx) error {
			for _, fr := range sc.frames {
				for _, m := range fr.muts {
					if err := applyOrdered(tx, m); err != nil {
						return err
					}
				}
			}
			return putJournalMeta(tx, fresh, last)
		})
		switch {
		case err == nil:
			id, salt = fresh, journalSalt(fresh)
		case errors.Is(err, ErrCorrupt) || errors.As(err, new(*commitPanic)) || !f.journalOn():
			closeSegments(segs)
			return nil, 0, fmt.Errorf("journal: replay: %w", err)
		default:
			// bbolt cannot take them now (a full disk): the engine opens
			// with them in the overlay and their segments held, and the
			// checkpoint tries again; a checkpoint that fails then fails
			// the engine closed, and they stay in the journal.
			log.Warn("idem: journal: replay into the file failed; its writes stay in the journal", "err", err)
			for _, fr := range sc.frames {
				ov.apply(fr.seq, fr.muts)
			}
			held = sc.held
		}
	}
	if !f.journalOn() {
		closeSegments(segs)
		return nil, sc.writes, nil
	}
	limit := int64(f.JournalSize)
	if limit == 0 {
		limit = DefaultJournalSize
	}
	j := &journal{
		db: db, pipe: pipe, ov: ov, id: id, salt: salt, log: log,
		segs:  newSegments(dir, segmentSize, max(limit, 2*segmentSize), segs, held),
		next:  last + 1,
		kickc: make(chan struct{}, 1), urgentc: make(chan struct{}, 1),
		quit: make(chan struct{}), done: make(chan struct{}),
	}
	j.delay.Store(int64(catchUpDelay))
	j.ckpt.Store(last)
	if held != nil {
		j.ckpt.Store(ckpt)
		j.kick(false)
	}
	j.ov.last = last
	go j.loop()
	return j, sc.writes, nil
}
