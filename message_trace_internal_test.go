package idem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// testdata/message-v1-dead.bin is a dead letter in message encoding version
// 1, as builds of format versions 1 and 2 wrote it (testdata/README.md). It
// decodes with every field and no trace context, and is written again in
// version 2.
func TestMessageEncodingVersion1(t *testing.T) {
	b, err := os.ReadFile("testdata/message-v1-dead.bin")
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != messageVersionV1 {
		t.Fatalf("testdata holds encoding version %d, want 1", b[0])
	}
	m, err := decodeMessage(9, b)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	if m.Topic != "refund" || m.Key != "r-1" || m.OrderingKey != "order-7" || m.Index != 3 ||
		string(m.Payload) != "refund 7" || m.Failures != 2 || !m.EnqueuedAt.Equal(at) ||
		m.LastError != "gateway timeout" || !m.Dead || !m.DeadAt.Equal(at.Add(time.Hour)) ||
		m.DeadLetterRetention != 30*24*time.Hour || m.Trace != nil {
		t.Fatalf("decoded %+v", m)
	}
	again := encodeMessage(nil, m)
	if again[0] != messageVersion {
		t.Fatalf("re-encoded in version %d, want %d", again[0], messageVersion)
	}
	m2, err := decodeMessage(9, again)
	if err != nil {
		t.Fatal(err)
	}
	if m2.LastError != m.LastError || m2.DeadLetterRetention != m.DeadLetterRetention || m2.Trace != nil {
		t.Fatalf("re-decoded %+v", m2)
	}
}

// reframe replaces b's body with body and a fresh checksum.
func reframe(body []byte) []byte {
	return binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, crcTable))
}

// A trace context is refused where it cannot be: in encoding version 1,
// empty, or over idemcore.MaxMessageTrace bytes; one over the bound is not
// stored at all.
func TestMessageTraceRules(t *testing.T) {
	base := &Message{Topic: "t", Key: "k", OrderingKey: "k", Trace: bytes.Repeat([]byte{'x'}, idemcore.MaxMessageTrace)}
	good := encodeMessage(nil, base)
	body := good[:len(good)-4]
	field := 2 + idemcore.MaxMessageTrace // uvarint(512) is 2 bytes
	head := body[:len(body)-field]

	over := append(bytes.Clone(head), binary.AppendUvarint(nil, idemcore.MaxMessageTrace+1)...)
	over = append(over, bytes.Repeat([]byte{'x'}, idemcore.MaxMessageTrace+1)...)
	empty := append(bytes.Clone(head), 0)
	v1 := bytes.Clone(body)
	v1[0] = messageVersionV1
	for name, b := range map[string][]byte{
		"over the bound":        reframe(over),
		"empty":                 reframe(empty),
		"in encoding version 1": reframe(v1),
	} {
		if _, err := decodeMessage(1, b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := decodeMessage(1, good); err != nil {
		t.Fatalf("a trace context of MaxMessageTrace bytes: %v", err)
	}
	long := *base
	long.Trace = append(long.Trace, 'x')
	m, err := decodeMessage(1, encodeMessage(nil, &long))
	if err != nil || m.Trace != nil {
		t.Fatalf("a trace context over the bound: %+v, %v; want it not stored", m, err)
	}
}
