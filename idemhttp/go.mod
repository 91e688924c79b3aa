module github.com/idemkit/idem/idemhttp

go 1.26.0

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	github.com/stripe/stripe-go/v82 v82.5.1
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.46.0 // indirect
)

