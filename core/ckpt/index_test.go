package ckpt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLatestStaysInsideItsDirectory: the latest pointer names a step
// directory of its own root or is refused, quoting what it holds escaped
// and cut, never resuming from another directory.
func TestLatestStaysInsideItsDirectory(t *testing.T) {
	base := t.TempDir()
	root, other := filepath.Join(base, "run"), filepath.Join(base, "other")
	for _, d := range []string{root, other} {
		require.NoError(t, os.MkdirAll(filepath.Join(d, StepDir(2)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, StepDir(2), IndexFile), []byte("{}"), 0o644))
	}
	latest := filepath.Join(root, LatestFile)
	refused := func(held string) string {
		return "ckpt: " + latest + " holds " + held + ", not the name of a checkpoint of " + root +
			" (like step-0000000); write the name of one of its step directories into it, or remove it to start afresh"
	}
	for _, c := range []struct{ content, want string }{
		{"step-0000002\n", ""},
		{"../other/step-0000002\n", refused(`"../other/step-0000002\n"`)},
		{"/srv/other/step-0000002", refused(`"/srv/other/step-0000002"`)},
		{"step-0000002/../../other/step-0000002", refused(`"step-0000002/../../other/step-0000002"`)},
		{"step-2", refused(`"step-2"`)},
		{"step-0000003\n", "ckpt: " + latest + " points at " + filepath.Join(root, StepDir(3)) + ", which is not a complete checkpoint"},
		{"line one\nline two\x1b[2J\x00" + strings.Repeat("z", 100), refused(`"line one\nline two\x1b[2J\x00zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"… (122 bytes)`)},
	} {
		require.NoError(t, os.WriteFile(latest, []byte(c.content), 0o644))
		dir, err := Resolve(root)
		if c.want == "" {
			require.NoError(t, err)
			require.Equal(t, filepath.Join(root, StepDir(2)), dir)
			continue
		}
		require.EqualError(t, err, c.want, "latest holding %q", c.content)
	}
	_, err := Resolve(filepath.Join(base, "empty"))
	require.ErrorIs(t, err, ErrNoCheckpoint)
}
