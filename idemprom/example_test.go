package idemprom_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemprom"
)

// One Collector is the engine's Observer and a registered collector; serve
// the registry with promhttp.HandlerFor as usual.
func Example() {
	c := idemprom.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	e, err := idem.Open(filepath.Join(dir, "idem.db"), &idem.Options{Observer: c})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	for range 3 { // one execution, two replays
		_, _ = e.Do(context.Background(), "order-42", nil, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v > 0 {
				fmt.Println(mf.GetName(), labels(m.GetLabel()), v)
			}
		}
	}
	// Output:
	// idem_executions_total op=do,recovered=false 1
	// idem_replays_total op=do 2
}

func labels(ls []*dto.LabelPair) string {
	s := ""
	for i, l := range ls {
		if i > 0 {
			s += ","
		}
		s += l.GetName() + "=" + l.GetValue()
	}
	return s
}
