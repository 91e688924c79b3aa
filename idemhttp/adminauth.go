package idemhttp

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// Who may do what on the admin handler.

// AdminAction is what an admin request asks to do, as passed to
// AdminOptions.Authorize.
type AdminAction string

// AllowBearer returns an AdminOptions.Authorize that allows every action to
// requests carrying "Authorization: Bearer <token>" (RFC 6750), compared in
// constant time, and refuses all others. An empty token refuses everything.
// For finer rules (read-only tokens), write the function yourself.
func AllowBearer(token string) func(*http.Request, AdminAction) bool {
	want := []byte(token)
	return func(r *http.Request, _ AdminAction) bool {
		got, ok := adminBearer(r)
		return ok && len(want) > 0 && subtle.ConstantTimeCompare([]byte(got), want) == 1
	}
}

// adminBearer returns the token of an "Authorization: Bearer" header.
func adminBearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
