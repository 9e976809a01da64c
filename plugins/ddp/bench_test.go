package ddp_test

import (
	"testing"
	"time"

	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// BenchmarkStep trains a wider model on 2 ranks, naive against bucketed,
// on each backend. Besides the time per run it reports ms/step and
// exposed_ms/step: the time from the end of each step's backward to the
// start of its optimizer, i.e. the gradient communication backward did not
// hide (plus the loss all-reduce). Run with:
//
//	go test ./plugins/ddp -bench Step -run '^$'
func BenchmarkStep(b *testing.B) {
	cfg := ptest.Config()
	cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.NHead, cfg.Model.BlockSize = 4, 128, 4, 64
	cfg.Train.Steps, cfg.Train.BatchSize, cfg.Train.Threads = 4, 4, 1 // 4 per rank on 2 ranks
	for _, backend := range backends {
		for _, v := range []variant{naive, {"bucketed", "bucketed", 0.25, 0.05}} {
			b.Run(backend+"/"+v.name, func(b *testing.B) {
				var exposed, total float64 // µs, rank 0
				runs := 0
				for range b.N {
					start := time.Now()
					rs := ptest.Parallel(b, cfg, 2, backend, v.build)
					total += float64(time.Since(start).Microseconds())
					backward := named(rs[0].Trace, "backward")
					for s, o := range named(rs[0].Trace, "optimizer") {
						exposed += o.TS - end(backward[s])
					}
					runs++
				}
				steps := float64(runs * cfg.Train.Steps)
				b.ReportMetric(total/steps/1e3, "ms/step")
				b.ReportMetric(exposed/steps/1e3, "exposed_ms/step")
			})
		}
	}
}
