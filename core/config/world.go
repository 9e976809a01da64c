package config

import "fmt"

// CheckWorld holds the parallel layout to the number of ranks the job will
// have, so a mismatch is an error before any rank starts (and in a single
// process, where parallel.dp=2 would otherwise mean nothing).
func (c Config) CheckWorld(world int) error {
	p := c.Parallel
	other := p.TP * p.PP * p.CP
	if p.DP > 0 && p.DP*other != world {
		return fmt.Errorf("config: parallel.dp=%d × tp=%d × pp=%d × cp=%d needs %d ranks, but the job has %d; set parallel.dp=%d, or 0 to use every rank",
			p.DP, p.TP, p.PP, p.CP, p.DP*other, world, world/max(other, 1))
	}
	if other > world {
		return fmt.Errorf("config: parallel.tp=%d × pp=%d × cp=%d needs at least %d ranks, but the job has %d: lower them or start more ranks (--nproc %d)",
			p.TP, p.PP, p.CP, other, world, other)
	}
	if other > 0 && world%other != 0 {
		return fmt.Errorf("config: %d ranks do not divide into tp=%d × pp=%d × cp=%d", world, p.TP, p.PP, p.CP)
	}
	return c.checkMoEWorld(world) // moe.go
}
