package robustness

import (
	"errors"
	"fmt"
	"syscall"

	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem"
)

// sentinels are the errors a child reports its error matches, by name.
var sentinels = map[string]error{
	"ErrFormat": idem.ErrFormat, "ErrCorrupt": idem.ErrCorrupt, "ErrStorageFailed": idem.ErrStorageFailed,
	"ErrFileFull": idem.ErrFileFull, "ErrDatabaseReadOnly": bolterrors.ErrDatabaseReadOnly,
	"ErrTimeout": bolterrors.ErrTimeout, "EACCES": syscall.EACCES, "EROFS": syscall.EROFS,
	"ENOSPC": syscall.ENOSPC, "EISDIR": syscall.EISDIR,
}

func printSentinels(err error) {
	for name, s := range sentinels {
		if errors.Is(err, s) {
			fmt.Println("is:" + name)
		}
	}
}
