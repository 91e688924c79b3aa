package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

func TestService(t *testing.T) {
	path := filepath.Join(t.TempDir(), "orders.db")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln, path) }()
	url := "http://" + ln.Addr().String() + "/v1/orders"
	client := &http.Client{Transport: &idemhttp.Transport{}}

	send := func(user, key, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if user != "" {
			req.Header.Set("Authorization", "Bearer "+user)
		}
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	book := `{"sku":"book","quantity":1}`
	first, b1 := send("alice", `"order-1"`, book)
	again, b2 := send("alice", `order-1`, book)
	if first.StatusCode != http.StatusCreated || again.Header.Get(idemhttp.HeaderReplayed) != "true" || b1 != b2 {
		t.Fatalf("replay: %d %q, then %q %q", first.StatusCode, b1, again.Header.Get(idemhttp.HeaderReplayed), b2)
	}
	if resp, _ := send("alice", "order-1", `{"sku":"pen","quantity":1}`); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("other body: %d", resp.StatusCode)
	}
	if resp, b := send("bob", "order-1", book); resp.StatusCode != http.StatusCreated || b == b1 {
		t.Fatalf("bob: %d %q", resp.StatusCode, b)
	}
	if resp, _ := send("", "order-2", book); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d", resp.StatusCode)
	}
	if resp, _ := send("alice", "order-2", `{"sku":""}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("invalid body: %d", resp.StatusCode)
	}
	if resp, _ := send("alice", "order-2", book); resp.StatusCode != http.StatusCreated || resp.Header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("corrected body with the same key: %d", resp.StatusCode)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	// Both closed: the file opens again, with alice's order recorded.
	e, err := idem.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rec, err := e.Get(idemhttp.StoredKey("alice", "order-1"))
	if err != nil || !bytes.Contains(rec.Response, []byte(strings.TrimSpace(b1))) {
		t.Fatalf("alice's record: %v", err)
	}
}
