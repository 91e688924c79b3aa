package idem

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
)

func TestMessageEncodingRoundTrip(t *testing.T) {
	at := time.Unix(1700000000, 123)
	for _, tc := range []struct {
		name string
		m    Message
	}{
		{"minimal", Message{Topic: "t", Key: "k", OrderingKey: "k"}},
		{"nil payload", Message{Topic: "charge_card", Key: "order-1", OrderingKey: "order-1", EnqueuedAt: at}},
		{"empty payload", Message{Topic: "charge_card", Key: "order-1", OrderingKey: "order-1", Payload: []byte{}}},
		{"ordering key", Message{Topic: "refund", Key: "r-1", OrderingKey: "order-7", Index: 3, Payload: []byte("x")}},
		{"retrying", Message{Topic: "t", Key: "k", OrderingKey: "k", Attempt: 4, NextAttemptAt: at, LastError: "gateway timeout"}},
		{"dead", Message{Topic: "t", Key: "k", OrderingKey: "k", Failures: 9, Dead: true, DeadAt: at, LastError: "boom"}},
		{"dead with its retention", Message{Topic: "t", Key: "k", OrderingKey: "k", Failures: 1, Dead: true, DeadAt: at, DeadLetterRetention: 30 * 24 * time.Hour}},
		{"large", Message{Topic: strings.Repeat("t", 255), Key: strings.Repeat("k", 255), OrderingKey: "o", Index: 1 << 20, Payload: bytes.Repeat([]byte{0xff}, 1<<16)}},
		{"trace context", Message{Topic: "t", Key: "k", OrderingKey: "k", Trace: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}},
		{"largest trace context, dead", Message{Topic: "t", Key: "k", OrderingKey: "k", Dead: true, DeadAt: at, DeadLetterRetention: time.Hour, Trace: bytes.Repeat([]byte{'t'}, idemcore.MaxMessageTrace)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := encodeMessage(nil, &tc.m)
			got, err := decodeMessage(42, b)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.m
			want.Seq, want.DownstreamKey = 42, DownstreamKey(want.Key, want.Index)
			if got.Seq != want.Seq || got.Topic != want.Topic || got.Key != want.Key || got.Index != want.Index ||
				got.DownstreamKey != want.DownstreamKey || got.OrderingKey != want.OrderingKey ||
				!bytes.Equal(got.Payload, want.Payload) || (got.Payload == nil) != (want.Payload == nil) ||
				got.Failures != want.Failures || !got.EnqueuedAt.Equal(want.EnqueuedAt) ||
				!got.NextAttemptAt.Equal(want.NextAttemptAt) || got.LastError != want.LastError ||
				got.Dead != want.Dead || !got.DeadAt.Equal(want.DeadAt) || got.DeadLetterRetention != want.DeadLetterRetention ||
				!bytes.Equal(got.Trace, want.Trace) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestMessageDecodeCorrupt(t *testing.T) {
	good := encodeMessage(nil, &Message{Topic: "t", Key: "k", OrderingKey: "k", Payload: []byte("p")})
	flip := bytes.Clone(good)
	flip[len(flip)/2] ^= 1
	version := bytes.Clone(good)
	version[0] = messageVersion + 1
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     good[:10],
		"truncated": good[:len(good)-1],
		"bit flip":  flip,
		"version":   version,
		"trailing":  append(bytes.Clone(good), 0),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeMessage(1, b); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
		})
	}
}

// FuzzDecodeMessage checks that the decoder never panics, and that whatever
// it accepts survives encoding and decoding again.
func FuzzDecodeMessage(f *testing.F) {
	f.Add(encodeMessage(nil, &Message{Topic: "t", Key: "k", OrderingKey: "k"}))
	f.Add(encodeMessage(nil, &Message{Topic: "charge_card", Key: "order-1", OrderingKey: "o", Index: 2,
		Payload: []byte(`{"cents":1200}`), Failures: 3, LastError: "timeout", EnqueuedAt: time.Unix(1, 0)}))
	f.Add(encodeMessage(nil, &Message{Topic: "t", Key: "k", OrderingKey: "k", Dead: true, DeadAt: time.Unix(5, 0)}))
	f.Add(encodeMessage(nil, &Message{Topic: "t", Key: "k", OrderingKey: "k", Dead: true, DeadAt: time.Unix(5, 0), DeadLetterRetention: time.Hour}))
	f.Add(encodeMessage(nil, &Message{Topic: "t", Key: "k", OrderingKey: "k", Trace: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}))
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(7, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		again, err := decodeMessage(7, encodeMessage(nil, m))
		if err != nil {
			t.Fatalf("re-encoding does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("re-encoding differs:\n%+v\n%+v", m, again)
		}
	})
}
