package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// The admin handler mounted under /admin/idem/ beside the program's own
// routes, guarded by a bearer token; `idem --url http://HOST/admin/idem
// --token TOKEN get KEY` talks to it.
func ExampleAdmin() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	e, err := idem.Open(filepath.Join(dir, "idem.db"), nil)
	if err != nil {
		panic(err)
	}
	defer e.Close() // after the server has shut down
	_, _ = e.Do(context.Background(), "order-42", []byte("args"), func(context.Context) ([]byte, error) {
		return []byte(`{"order":42}`), nil
	})

	mux := http.NewServeMux()
	mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", idemhttp.Admin(e, &idemhttp.AdminOptions{
		Authorize: idemhttp.AllowBearer("s3cret"), // in production: from the environment
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	get := func(token string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/admin/idem/records?key=order-42", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.Status, resp.Header.Get("Content-Type"), len(body) > 0)
	}
	get("")       // refused: no token
	get("s3cret") // the record, its response hidden (ShowResponses is off)
	// Output:
	// 403 Forbidden application/problem+json true
	// 200 OK application/json true
}
