module github.com/idemkit/idem

go 1.26.0

require (
	github.com/cespare/xxhash/v2 v2.3.0
	go.etcd.io/bbolt v1.5.0
)

require (
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.46.0 // indirect
)
