package taubench

import (
	"embed"
	"os"
	"path/filepath"
)

// The built-in sample: a small retail world of idem's own (products,
// customers and their orders, generated; nothing of τ-bench's data) over the
// same 16 tools, with tasks written for it, in τ-bench's file format. Each
// task's reference outputs and changed records were computed by a fault-free
// run of the tools in process when the sample was generated
// (internal/gensample, through go generate), and are committed with it: a
// change to a tool that changes an answer fails the sample's tests until the
// sample is generated again, as τ-bench's own reference would catch it. idem
// taubench plays it when no τ-bench data is found.
//
//go:generate go run ./internal/gensample -out sample
//go:embed sample
var sample embed.FS

// WriteSample writes the built-in sample's four files (OrdersFile,
// UsersFile, ProductsFile and TasksFile) into dir, which must exist, so that
// dir can serve as Config.DataDir and dir/TasksFile as Config.TasksFile (the
// crash children read the files again). It returns the first error of
// writing a file.
func WriteSample(dir string) error {
	for _, name := range []string{OrdersFile, UsersFile, ProductsFile, TasksFile} {
		data, err := sample.ReadFile("sample/" + name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}
