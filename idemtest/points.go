package idemtest

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// The crash matrix is generated from the failpoints in the code: every call
// fault.Err("name") in the Go files (tests and
// testdata excepted) of the state machine (idemcore), of this suite, and
// of the module the backend's test runs in. A point's name must be a string
// literal, so that the scan sees it, and a point must be able to fail
// (fault.Err, not fault.Point), since the matrix runs the error action there.

// pointSite is where a failpoint is marked.
type pointSite struct {
	Name string
	File string // relative to the directory scanned
	Line int
}

// suiteDirs are the directories whose failpoints every backend reaches: the
// state machine's (idemcore) and this package's, found beside this
// file's source.
func suiteDirs() ([]string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return nil, errors.New("idemtest: cannot find the suite's source")
	}
	here := filepath.Dir(file)
	return []string{filepath.Join(filepath.Dir(here), "idemcore"), here}, nil
}

// moduleDir is the root of the module that holds dir (the directory of its
// go.mod), or "" if none does.
func moduleDir(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

// backendPoints returns the failpoints a backend's engine reaches, by name:
// those of the suite's directories and those of the module of the working
// directory (the backend's test package), in no other module.
func backendPoints() (map[string]pointSite, error) {
	dirs, err := suiteDirs()
	if err != nil {
		return nil, err
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	if mod := moduleDir(wd); mod != "" {
		dirs = append(dirs, mod)
	}
	points := map[string]pointSite{}
	for _, d := range dirs {
		sites, err := scanPoints(d)
		if err != nil {
			return nil, err
		}
		for _, s := range sites {
			if _, ok := points[s.Name]; !ok {
				points[s.Name] = s
			}
		}
	}
	return points, nil
}

// scanPoints parses the Go files under root (not _test.go files, not under
// testdata, hidden directories or another module's root) and returns every
// fault.Err call's point, by file and line. A call whose name is not a
// string literal is an error, and so is fault.Point, which cannot fail.
func scanPoints(root string) ([]pointSite, error) { return scan(root, false) }

// scan is scanPoints; with modules set it also walks into other modules.
func scan(root string, modules bool) ([]pointSite, error) {
	var sites []pointSite
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if path != root && !modules {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		ast.Inspect(f, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := c.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Point" && sel.Sel.Name != "Err") {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "fault" {
				return true
			}
			pos := fset.Position(c.Pos())
			if sel.Sel.Name == "Point" {
				// The matrix runs the error action at every point: a
				// Point cannot return one.
				bad = append(bad, fmt.Sprintf("%s:%d (fault.Point: mark it with fault.Err and give the error its step's failure path)", rel, pos.Line))
				return true
			}
			if len(c.Args) == 1 {
				if lit, ok := c.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if name, err := strconv.Unquote(lit.Value); err == nil && name != "" {
						sites = append(sites, pointSite{Name: name, File: rel, Line: pos.Line})
						return true
					}
				}
			}
			bad = append(bad, fmt.Sprintf("%s:%d", rel, pos.Line))
			return true
		})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("idemtest: failpoints the crash matrix cannot run (a name that is not a string literal, or fault.Point): %s", strings.Join(bad, ", "))
	}
	sort.Slice(sites, func(i, j int) bool { return sites[i].Name < sites[j].Name })
	return sites, nil
}
