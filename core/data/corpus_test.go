package data

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeTree creates files (relative path -> content) under a temp dir.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for rel, content := range files {
		p := filepath.Join(root, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return root
}

func TestLoadCorpusFile(t *testing.T) {
	root := writeTree(t, map[string]string{"a.txt": "hello world"})
	c, err := LoadCorpus(filepath.Join(root, "a.txt"), 0)
	require.NoError(t, err)
	assert.Equal(t, "hello world", string(c.Text))
	assert.Equal(t, 1, c.Files)
	assert.Contains(t, c.Source, "a.txt")
	assert.Contains(t, c.Source, "11 B")

	c, err = LoadCorpus(filepath.Join(root, "a.txt"), 5)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(c.Text))
}

func TestLoadCorpusDirectoryOrder(t *testing.T) {
	// "a.go" sorts before "a/x" as whole paths ('.' < '/'), although a
	// per-directory walk would visit the directory "a" first.
	root := writeTree(t, map[string]string{
		"b.txt":     "B",
		"a/x":       "X",
		"a.go":      "G",
		"a/sub/y":   "Y",
		"c/d/e.txt": "E",
	})
	require.NoError(t, os.Symlink(filepath.Join(root, "b.txt"), filepath.Join(root, "link")))
	c, err := LoadCorpus(root, 0)
	require.NoError(t, err)
	assert.Equal(t, "GYXBE", string(c.Text), "sorted path order, regular files only")
	assert.Equal(t, 5, c.Files)
	assert.True(t, strings.HasPrefix(c.Source, "directory "), c.Source)
	assert.Contains(t, c.Source, "5 text files, 5 B)")

	c, err = LoadCorpus(root, 3)
	require.NoError(t, err)
	assert.Equal(t, "GYX", string(c.Text))
	assert.Contains(t, c.Source, "; read 3 B of 5 B (data.max_bytes; 0 reads everything)", "a cut read says so")
	assert.Equal(t, 3, c.Files)
}

func TestLoadCorpusSymlinkedDirectory(t *testing.T) {
	root := writeTree(t, map[string]string{"real/a": "A", "real/b": "B", "real/x.go": "X"})
	link := filepath.Join(root, "link")
	require.NoError(t, os.Symlink(filepath.Join(root, "real"), link))
	c, err := LoadCorpus(link, 0)
	require.NoError(t, err)
	assert.Equal(t, "ABX", string(c.Text))
	files, err := goSourceFiles(link)
	require.NoError(t, err)
	require.Len(t, files, 1)
	assert.Equal(t, "x.go", filepath.Base(files[0]))
}

func TestLoadCorpusCapCutsMidFile(t *testing.T) {
	root := writeTree(t, map[string]string{"1": "abcd", "2": "efgh", "3": "ijkl"})
	c, err := LoadCorpus(root, 6)
	require.NoError(t, err)
	assert.Equal(t, "abcdef", string(c.Text))
	assert.Equal(t, 2, c.Files)
}

func TestLoadCorpusErrors(t *testing.T) {
	root := t.TempDir()
	missing := filepath.Join(root, "nope.txt")
	_, err := LoadCorpus(missing, 0)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), `data: data.path "`+missing+`" does not exist: `), err.Error())

	empty := writeTree(t, map[string]string{"e.txt": ""})
	e := filepath.Join(empty, "e.txt")
	_, err = LoadCorpus(e, 0)
	require.EqualError(t, err, `data: corpus at data.path "`+e+`" is empty (file): point data.path at non-empty text, or set it to "" for the default corpus`)

	_, err = LoadCorpus(empty, 0)
	require.EqualError(t, err, `data: corpus at data.path "`+empty+`" is empty (directory with 1 regular files): point data.path at non-empty text, or set it to "" for the default corpus`)
}

func TestGoSourceFilesWalk(t *testing.T) {
	root := writeTree(t, map[string]string{
		"z.go":                  "z",
		"a/b.go":                "b",
		"a/b_test.go":           "t",
		"a/testdata/x.go":       "x",
		"a/testdata/deep/y.go":  "y",
		"c/notes.txt":           "n",
		"c/go.mod":              "m",
		"c/d.go":                "d",
		"testdatax/keep.go":     "k",
		"e/file.go.txt":         "no",
		"e/strange_test.go.bak": "no",
	})
	files, err := goSourceFiles(root)
	require.NoError(t, err)
	var rel []string
	for _, f := range files {
		r, err := filepath.Rel(root, f)
		require.NoError(t, err)
		rel = append(rel, filepath.ToSlash(r))
	}
	assert.Equal(t, []string{"a/b.go", "c/d.go", "testdatax/keep.go", "z.go"}, rel)
}

func TestDefaultCorpus(t *testing.T) {
	const maxBytes = 64 << 10
	c, err := LoadCorpus("", maxBytes)
	require.NoError(t, err)
	assert.Len(t, c.Text, maxBytes, "honours the cap exactly")
	assert.True(t, strings.HasPrefix(c.Source, "GOROOT/src Go files ("), c.Source)
	assert.Contains(t, c.Source, "64.0 KiB")
	assert.Contains(t, string(c.Text), "package ", "Go sources")
	assert.Greater(t, c.Files, 0)

	// The text must be exactly the first maxBytes of the listed files.
	root, err := goroot()
	require.NoError(t, err)
	files, err := goSourceFiles(filepath.Join(root, "src"))
	require.NoError(t, err)
	var want []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		want = append(want, b...)
		if len(want) >= maxBytes {
			break
		}
	}
	assert.Equal(t, string(want[:maxBytes]), string(c.Text))
}

func TestSplit(t *testing.T) {
	c := &Corpus{Text: []byte("0123456789")}
	train, val := c.Split(0.3)
	assert.Equal(t, Encode("0123456"), train)
	assert.Equal(t, Encode("789"), val)

	train, val = c.Split(0)
	assert.Equal(t, Encode("0123456789"), train)
	assert.Empty(t, val)

	// floor(10*0.25) = 2 validation tokens.
	train, val = c.Split(0.25)
	assert.Equal(t, Encode("01234567"), train)
	assert.Equal(t, Encode("89"), val)

	// Appending to train must not clobber val.
	train, val = c.Split(0.5)
	_ = append(train, 'X')
	assert.Equal(t, Encode("56789"), val)

	assert.PanicsWithValue(t, "data: Split(-0.1): valFraction must be in [0, 1]", func() { c.Split(-0.1) })
}

// A directory corpus reads only text: files with a NUL byte or invalid
// UTF-8 are skipped and counted.
func TestLoadCorpusDirectorySkipsBinary(t *testing.T) {
	root := writeTree(t, map[string]string{
		"a.txt":   "hello ",
		"b.bin":   "\x00\x01\x02",
		"c.txt":   "wörld",
		"d.latin": "caf\xe9",
	})
	c, err := LoadCorpus(root, 0)
	require.NoError(t, err)
	assert.Equal(t, "hello wörld", string(c.Text))
	assert.Equal(t, 2, c.Files)
	assert.Contains(t, c.Source, "(2 text files, 12 B; 2 files that are not text skipped)")
}
