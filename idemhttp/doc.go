// Package idemhttp puts an idem engine in front of an HTTP API: a server
// middleware that answers the Idempotency-Key header (IETF
// draft-ietf-httpapi-idempotency-key-header, revision 07, and Stripe's
// behaviour), and a client transport that gives each logical request one key
// and retries it.
package idemhttp
