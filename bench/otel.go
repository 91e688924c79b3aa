package bench

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/kit/benchkit"
)

// OtelContenders are idem with idemotel installed (issue 22), to measure
// what the Tracer and Observer hooks cost on the replay rows (the only rows
// they run: Workloads): idem+otel-noop with OpenTelemetry's no-op providers,
// idem+otel-drop with the SDK's providers, a sampler that drops every span
// (sdktrace.NeverSample) and a meter whose ManualReader is never collected
// (the instruments still aggregate every measurement).
func OtelContenders() []benchkit.Contender {
	return []benchkit.Contender{
		{Name: "idem+otel-noop", Open: otelIdem("idem+otel-noop", func() (*idemotel.Telemetry, error) {
			return idemotel.New(&idemotel.Options{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: noop.NewMeterProvider()})
		})},
		{Name: "idem+otel-drop", Open: otelIdem("idem+otel-drop", func() (*idemotel.Telemetry, error) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			return idemotel.New(&idemotel.Options{TracerProvider: tp, MeterProvider: mp})
		})},
	}
}

// otelIdem opens benchkit's idem contender named name with the Telemetry
// made installed in its Options.
func otelIdem(name string, make func() (*idemotel.Telemetry, error)) func(context.Context, string) (benchkit.Deduper, error) {
	return func(ctx context.Context, dir string) (benchkit.Deduper, error) {
		tel, err := make()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return benchkit.OpenIdemWith(name, tel.Install)(ctx, dir)
	}
}

// isOtel reports whether the contender named is one of OtelContenders.
func isOtel(name string) bool {
	for _, c := range OtelContenders() {
		if c.Name == name {
			return true
		}
	}
	return false
}
