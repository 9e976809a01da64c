// Package plugins is the home of tinyacc's parallelism strategies, one folder
// per dimension of the Ultra-Scale Playbook:
//
//	ddp   data parallel: naive all-reduce and bucketed, overlapped all-reduce
//	zero  ZeRO stages 1, 2 and 3 over the data-parallel group
//	tp    tensor (and sequence) parallel, Megatron style
//	pp    pipeline schedules (AFAB, 1F1B, interleaved, ZB)
//	cp    context parallel (ring and all-gather attention, zigzag split)
//	ep    expert parallel (experts over dp × cp ranks, tokens by all-to-all)
//
// Each strategy is a trainer.Plugin implementing only the hooks it needs
// (see core/trainer/plugin.go); the naive form of each lives beside the
// optimized one. Build (registry.go) turns a config into the plugins of one
// rank, and ptest holds every parallel layout to a single process.
package plugins
