package idem

// The store's list of slot buckets, in memory: a lookup opens only these,
// with no cursor over the root bucket.

import (
	"slices"

	"go.etcd.io/bbolt"
)

// knownSlot is a slot and its bucket name, built once.
type knownSlot struct {
	timeSlot
	name []byte
}

// loadSlots reads the list of slot buckets at Open.
func (s *store) loadSlots(tx *bbolt.Tx) error {
	var list []knownSlot
	err := s.forEachSlot(tx, func(sl timeSlot, _ *bbolt.Bucket) error {
		list = append(list, knownSlot{sl, sl.Name()})
		return nil
	})
	s.slots.Store(&list)
	return err
}

func (s *store) knownSlots() []knownSlot {
	if p := s.slots.Load(); p != nil {
		return *p
	}
	return nil
}

func compareSlots(a knownSlot, b timeSlot) int {
	if a.Start != b.Start {
		return cmpInt64(a.Start, b.Start)
	}
	return cmpInt64(a.End, b.End)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// addSlot adds sl to the list if it is not there yet.
func (s *store) addSlot(sl timeSlot) {
	if _, found := slices.BinarySearchFunc(s.knownSlots(), sl, compareSlots); found {
		return
	}
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	old := s.knownSlots()
	at, found := slices.BinarySearchFunc(old, sl, compareSlots)
	if found {
		return
	}
	list := slices.Insert(slices.Clone(old), at, knownSlot{sl, sl.Name()})
	s.slots.Store(&list)
}

// removeSlot removes sl from the list, after its bucket was dropped.
func (s *store) removeSlot(sl timeSlot) {
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	list := slices.DeleteFunc(slices.Clone(s.knownSlots()), func(x knownSlot) bool { return x.timeSlot == sl })
	s.slots.Store(&list)
}
