module github.com/idemkit/idem/robustness

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.etcd.io/bbolt v1.5.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.46.0 // indirect
)

