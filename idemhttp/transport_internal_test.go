package idemhttp

import (
	"bytes"
	"net/http"
	"reflect"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"3", 3 * time.Second, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{"Tue, 01 Dec 2026 10:00:30 GMT", 30 * time.Second, true},
		{"Tue, 01 Dec 2026 09:00:00 GMT", 0, true},
	}
	for _, tt := range tests {
		got, ok := retryAfter(tt.in, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestHeaderValue(t *testing.T) {
	for in, want := range map[string]string{
		"abc":   `"abc"`,
		`a"b\c`: `"a\"b\\c"`,
		"é":     "é",
		"a\tb":  "a\tb",
	} {
		got := headerValue(in)
		if got != want {
			t.Errorf("headerValue(%q) = %q, want %q", in, got, want)
		}
		if s, ok := parseSFString(got); ok != (got != in) || ok && s != in {
			t.Errorf("parseSFString(%q) = %q, %v: does not give %q back", got, s, ok, in)
		}
	}
}

func TestResponseRoundTrip(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}, "Empty": {}}
	for _, body := range [][]byte{nil, {}, []byte("hello")} {
		b := encodeResponse(201, h, body)
		st, h2, body2, err := decodeResponse(b)
		if err != nil || st != 201 || !reflect.DeepEqual(h, h2) || !bytes.Equal(body, body2) {
			t.Fatalf("round trip: %d %v %q %v", st, h2, body2, err)
		}
		for i := range b[:len(b)-len(body)] {
			if _, _, _, err := decodeResponse(b[:i]); err == nil {
				t.Fatalf("a record cut at %d of %d decoded", i, len(b))
			}
		}
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(encodeResponse(200, http.Header{"Content-Type": {"text/plain"}}, []byte("ok")))
	f.Add(encodeResponse(204, nil, nil))
	f.Add([]byte{1, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, h, body, err := decodeResponse(b)
		if err != nil {
			return
		}
		if again := encodeResponse(st, h, body); !bytes.Equal(again, b) {
			// Header order is canonical on encode: decode(encode(x)) must hold.
			st2, h2, body2, err := decodeResponse(again)
			if err != nil || st2 != st || !reflect.DeepEqual(h, h2) || !bytes.Equal(body, body2) {
				t.Fatalf("re-encoding changed the response")
			}
		}
	})
}
