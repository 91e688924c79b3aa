package benchkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
)

// A Plan is the rows of one run: the workload × contender pairs selected,
// grouped so that each contender stores each fixture's records once and runs
// the fixture's workloads on it one after the other.
type Plan struct {
	workloads  []Workload
	contenders []Contender
	specs      []FixtureSpec         // in the order their first workload comes
	groups     map[FixtureSpec][]int // workload indexes of each spec, in order
	chosen     map[pair]bool
}

// pair is one row: workload index and contender index.
type pair struct{ w, c int }

// NewPlan selects the rows whose "workload/contender" name matches only (every
// row when only is nil), for example "replay/keys=1e6/cold/callers=64/idem",
// among those of contenders that run the workload (Workload.Contenders). It
// fails when only matches no row.
func NewPlan(workloads []Workload, contenders []Contender, only *regexp.Regexp) (*Plan, error) {
	p := &Plan{workloads: workloads, contenders: contenders, groups: map[FixtureSpec][]int{}, chosen: map[pair]bool{}}
	for wi, w := range workloads {
		for ci, c := range contenders {
			if only != nil && !only.MatchString(w.Name+"/"+c.Name) || !w.RunsOn(c.Name) {
				continue
			}
			p.chosen[pair{wi, ci}] = true
			g, ok := p.groups[w.Fixture]
			if !ok {
				p.specs = append(p.specs, w.Fixture)
			}
			if len(g) == 0 || g[len(g)-1] != wi {
				p.groups[w.Fixture] = append(g, wi)
			}
		}
	}
	if len(p.chosen) == 0 {
		return nil, fmt.Errorf("--only %q matches no workload/contender", only)
	}
	return p, nil
}

// Len is the number of rows.
func (p *Plan) Len() int { return len(p.chosen) }

// Run measures the rows on the disk of dir: the stores go in a temporary
// directory under it, removed afterwards. It tells progress how the run goes:
// a progress bar when progress is a terminal, a line per row otherwise, nothing
// when it is nil. It returns the rows in table order (the workloads' order,
// then the contenders'), with their ratios set. When ctx ends it stops and
// returns the rows measured so far with ctx.Err(); a store that fails to close
// adds its error, after every row has run.
func (p *Plan) Run(ctx context.Context, dir string, progress io.Writer) ([]Row, error) {
	root, err := os.MkdirTemp(dir, "idem-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)

	bar := newProgress(progress, p.Len())
	var closeErrs []error
	rows := map[pair]Row{}
	for _, spec := range p.specs {
		for ci, c := range p.contenders {
			var sel []int
			for _, wi := range p.groups[spec] {
				if p.chosen[pair{wi, ci}] {
					sel = append(sel, wi)
				}
			}
			if len(sel) == 0 || ctx.Err() != nil {
				continue
			}
			f, err := p.openFixture(ctx, bar, root, c, spec, p.workloads[sel[0]].Name)
			if err != nil {
				if ctx.Err() != nil {
					continue
				}
				for _, wi := range sel {
					row := NewRow(p.workloads[wi].Name, c.Name, nil, err)
					rows[pair{wi, ci}] = row
					bar.done(row)
				}
				continue
			}
			for _, wi := range sel {
				w := p.workloads[wi]
				bar.describe(rowLabel(w.Name, c.Name))
				r, err := w.Run(ctx, f, w.Load)
				if ctx.Err() != nil {
					break
				}
				row := NewRow(w.Name, c.Name, r, err)
				rows[pair{wi, ci}] = row
				bar.done(row)
			}
			if err := f.Close(); err != nil {
				closeErrs = append(closeErrs, fmt.Errorf("closing %s: %w", c.Name, err))
			}
		}
	}
	bar.finish()

	var out []Row
	for wi := range p.workloads {
		for ci := range p.contenders {
			if r, ok := rows[pair{wi, ci}]; ok {
				out = append(out, r)
			}
		}
	}
	SetRatios(out)
	return out, errors.Join(append(closeErrs, ctx.Err())...)
}

// openFixture opens c on spec in a directory of its own under root, telling
// the bar how the load goes.
func (p *Plan) openFixture(ctx context.Context, bar *progress, root string, c Contender, spec FixtureSpec, first string) (*Fixture, error) {
	dir, err := os.MkdirTemp(root, c.Name+"-")
	if err != nil {
		return nil, err
	}
	total := spec.Stored + spec.Expired
	label := rowLabel(first, c.Name)
	bar.describe(label + " storing records")
	f, err := OpenFixture(ctx, c, dir, spec, func(done int) {
		bar.describe(fmt.Sprintf("%s storing %d/%d records", label, done, total))
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return f, nil
}

// rowLabel names a row in the progress bar, in aligned columns.
func rowLabel(workload, contender string) string {
	return fmt.Sprintf("%-32s %-13s", workload, contender)
}
