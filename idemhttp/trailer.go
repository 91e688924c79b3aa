package idemhttp

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// Trailers: which fields net/http sends as trailers, and how they are declared.

// responseHeader is h without what net/http does not send as a header: the
// Trailer declaration (writeHead sends it) and http.TrailerPrefix fields.
func responseHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, vs := range h {
		if k != "Trailer" && !strings.HasPrefix(k, http.TrailerPrefix) {
			out[k] = vs
		}
	}
	return out
}

// declaredTrailers are the trailer names h's Trailer header declares, as
// net/http reads them: comma-separated, canonical, each once (sorted), not
// those RFC 9110 section 6.5.1 forbids in trailers.
func declaredTrailers(h http.Header) []string {
	var names []string
	for _, v := range h["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			k = textproto.CanonicalMIMEHeaderKey(strings.Trim(k, " \t"))
			if k != "" && validTrailer(k) && !slices.Contains(names, k) {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	return names
}

// validTrailer reports whether net/http sends a field named k (canonical)
// in trailers (golang.org/x/net/http/httpguts.ValidTrailerHeader).
func validTrailer(k string) bool {
	return validHeaderName(k) && !strings.HasPrefix(k, "If-") && !badTrailer[k]
}

// badTrailer are the fields net/http refuses in trailers (httpguts).
var badTrailer = map[string]bool{
	"Authorization": true, "Cache-Control": true, "Connection": true, "Content-Encoding": true,
	"Content-Length": true, "Content-Range": true, "Content-Type": true, "Expect": true,
	"Host": true, "Keep-Alive": true, "Max-Forwards": true, "Pragma": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true, "Proxy-Connection": true,
	"Range": true, "Realm": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Www-Authenticate": true,
}

// addFields appends vs to h[k], making h when it is nil.
func addFields(h http.Header, k string, vs []string) http.Header {
	if h == nil {
		h = http.Header{}
	}
	h[k] = append(h[k], vs...)
	return h
}
