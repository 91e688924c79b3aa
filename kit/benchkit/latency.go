package benchkit

import (
	"math"
	"math/bits"
	"time"
)

// The histogram is log-linear: values below 2^subBits nanoseconds have a
// bucket each; above, every power of two is split into 2^subBits buckets, so a
// quantile is off by at most 1/64 (1.6%) of its value.
const (
	subBits    = 6
	subCount   = 1 << subBits
	numBuckets = (64 - subBits) * subCount
)

// Histogram records latencies with a bounded relative error and a fixed size
// (30 KiB), whatever the number of samples. The zero value is empty and ready
// to use. It is not safe for concurrent use: give each caller its own and
// Merge them.
type Histogram struct {
	counts   [numBuckets]uint64
	n        uint64
	sum      time.Duration
	min, max time.Duration
}

func bucketOf(v uint64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1
	return (shift+1)*subCount + int(v>>shift) - subCount
}

// bucketMid is the middle of bucket i's range, in nanoseconds.
func bucketMid(i int) uint64 {
	if i < subCount {
		return uint64(i)
	}
	shift := i/subCount - 1
	low := uint64(i%subCount+subCount) << shift
	return low + (uint64(1)<<shift)/2
}

// Record adds one latency; negative ones count as zero.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	if d > h.max {
		h.max = d
	}
	h.n++
	h.sum += d
}

// Merge adds o's samples to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of samples.
func (h *Histogram) Count() int { return int(h.n) }

// Max is the largest sample, exactly; zero when empty.
func (h *Histogram) Max() time.Duration { return h.max }

// Mean is the mean sample; zero when empty.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Quantile is the q-quantile (0 ≤ q ≤ 1) of the samples: the smallest
// recorded value with at least q of the samples at or below it, to within
// 1.6%, and never outside [min, max]. Zero when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			v := time.Duration(bucketMid(i))
			return min(max(v, h.min), h.max)
		}
	}
	return h.max
}
