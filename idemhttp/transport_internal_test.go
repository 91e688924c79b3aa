package idemhttp

import (
	"bytes"
	"net/http"
	"reflect"
	"slices"
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
	responses := []*storedResponse{}
	for _, body := range [][]byte{nil, {}, []byte("hello")} {
		responses = append(responses,
			&storedResponse{status: 201, header: h, body: body},
			&storedResponse{status: 200, header: h, declared: []string{"X-Checksum"}, trailer: http.Header{"X-Checksum": {"abc"}, "X-Parts": {"1", "2"}}, body: body},
			&storedResponse{status: 200, header: http.Header{}, declared: []string{"X-Checksum"}, trailer: http.Header{}, body: body},
			&storedResponse{status: 200, header: http.Header{}, trailer: http.Header{"X-Parts": {"3"}}, body: body},
		)
	}
	for _, r := range responses {
		b := r.encode()
		if want := byte(recordVersion); r.hasTrailers() {
			if b[0] != recordVersionTrailers {
				t.Fatalf("a response with trailers encoded in version %d", b[0])
			}
		} else if b[0] != want {
			t.Fatalf("a response without trailers encoded in version %d, want %d (readable by earlier versions)", b[0], want)
		}
		got, err := decodeResponse(b)
		if err != nil || got.status != r.status || !reflect.DeepEqual(r.header, got.header) || !bytes.Equal(r.body, got.body) ||
			!slices.Equal(r.declared, got.declared) || len(r.trailer) != len(got.trailer) || (len(r.trailer) > 0 && !reflect.DeepEqual(r.trailer, got.trailer)) {
			t.Fatalf("round trip of %+v: %+v %v", r, got, err)
		}
		for i := range b[:len(b)-len(r.body)] {
			if _, err := decodeResponse(b[:i]); err == nil {
				t.Fatalf("a record cut at %d of %d decoded", i, len(b))
			}
		}
	}
	// Version 2 without trailers is not what encode writes.
	if _, err := decodeResponse([]byte{recordVersionTrailers, 200, 1, 0, 0, 0}); err == nil {
		t.Fatal("a version 2 record without trailers decoded")
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(encodeResponse(200, http.Header{"Content-Type": {"text/plain"}}, []byte("ok")))
	f.Add(encodeResponse(204, nil, nil))
	f.Add((&storedResponse{status: 200, declared: []string{"X-Checksum"}, trailer: http.Header{"X-Checksum": {"abc"}}, body: []byte("ok")}).encode())
	f.Add((&storedResponse{status: 201, trailer: http.Header{"X-Parts": {"1", "2"}}}).encode())
	f.Add([]byte{1, 0xff, 0xff, 0xff})
	f.Add([]byte{2, 0xc8, 0x01, 0, 1, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		if again := r.encode(); !bytes.Equal(again, b) {
			// Field order is canonical on encode: decode(encode(x)) must hold.
			r2, err := decodeResponse(again)
			if err != nil || r2.status != r.status || !reflect.DeepEqual(r.header, r2.header) || !bytes.Equal(r.body, r2.body) ||
				!slices.Equal(r.declared, r2.declared) || !reflect.DeepEqual(r.trailer, r2.trailer) {
				t.Fatalf("re-encoding changed the response")
			}
		}
	})
}
