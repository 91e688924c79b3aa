module github.com/idemkit/idem/idemhttp

go 1.26.0

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	golang.org/x/sys v0.46.0 // indirect
)

