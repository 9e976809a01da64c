package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOutputDirectoryRule: train's save_to and export's --to follow one
// rule: a missing directory is created; a path under a file is refused
// before any work with the setting named.
func TestOutputDirectoryRule(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	saved := filepath.Join(dir, "new", "deeper", "w.safetensors")
	code, _, errOut := runCLI("train", "--model.n_layer=1", "--model.n_embd=32", "--model.block_size=32", "--train.steps=1",
		"--train.eval_every=0", "--data.max_bytes=100000", "--save_to="+saved, "--checkpoint.dir="+ck)
	require.Equal(t, 0, code, errOut)
	require.FileExists(t, saved)

	exported := filepath.Join(dir, "other", "deeper", "e.safetensors")
	code, out, errOut := runCLI("export", "--from", ck, "--to", exported)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "to "+exported+"\n")
	require.FileExists(t, exported)

	file := filepath.Join(dir, "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	code, _, errOut = runCLI("train", "--model.n_layer=1", "--save_to="+filepath.Join(file, "w.safetensors"))
	require.Equal(t, 1, code)
	require.Equal(t, "tinyacc: save_to: cannot create "+file+": mkdir "+file+": not a directory\n", errOut)
	code, _, errOut = runCLI("export", "--from", ck, "--to", filepath.Join(file, "e.safetensors"))
	require.Equal(t, 1, code)
	require.Equal(t, "tinyacc: export --to: cannot create "+file+": mkdir "+file+": not a directory\n", errOut)
}

// TestSampleFromDirectory: --from a checkpoint directory says how to
// export it; --from another directory says what file it wants.
func TestSampleFromDirectory(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	code, _, errOut := runCLI("train", "--model.n_layer=1", "--model.n_embd=32", "--model.block_size=32", "--train.steps=1",
		"--train.eval_every=0", "--data.max_bytes=100000", "--checkpoint.dir="+ck)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = runCLI("sample", "--from", ck)
	require.Equal(t, 1, code)
	require.Equal(t, "tinyacc: sample: --from "+ck+" is a checkpoint directory; sample reads one weights file: "+
		"tinyacc export --from "+ck+" --to model.safetensors, then tinyacc sample --from model.safetensors\n", errOut)
	code, _, errOut = runCLI("sample", "--from", dir+"/")
	require.Equal(t, 1, code)
	require.Equal(t, "tinyacc: sample: --from "+dir+"/ is a directory; give the file tinyacc train --save_to=FILE or tinyacc export --to FILE wrote\n", errOut)
}

// TestEscapeControls: sampled text for a terminal keeps newlines, tabs and
// printable Unicode and escapes every other control character.
func TestEscapeControls(t *testing.T) {
	require.Equal(t, "a\tb\nc\\x1b[2Jd\\re\\a\\x00é\\u0085", escapeControls("a\tb\nc\x1b[2Jd\re\a\x00é\u0085"))
}
