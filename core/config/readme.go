package config

import (
	"fmt"
	"strconv"
	"strings"
)

// ReadmeStepsEnv caps train.steps (see capReadmeSteps).
const ReadmeStepsEnv = "TINYACC_README_STEPS"

// capReadmeSteps lowers train.steps to TINYACC_README_STEPS when that is
// set and smaller: the README test runs every example as written, and
// this keeps each one to a few steps whatever step count it names. It is
// a cap, never a raise, so a run the variable leaves alone is unchanged;
// the source of the capped key says where the value came from.
func capReadmeSteps(r *Resolved, env []string) error {
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name != ReadmeStepsEnv || value == "" {
			continue
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < 1 {
			return fmt.Errorf("config: %s=%q is not a positive step count (or unset)", ReadmeStepsEnv, value)
		}
		if n < r.Config.Train.Steps {
			r.Config.Train.Steps = n
			r.sources["train.steps"] = "env " + ReadmeStepsEnv
		}
	}
	return nil
}
