package idemmcp_test

import "go.etcd.io/bbolt"

type bboltTx = bbolt.Tx
