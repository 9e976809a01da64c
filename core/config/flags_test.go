package config

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withKeys swaps the key table for one built from another struct, so flag
// forms for types Config does not use yet (bool, duration) can be exercised.
func withKeys(t *testing.T, typ reflect.Type) {
	oldFields, oldByKey, oldChildren := fields, fieldByKey, children
	fields = buildFields(typ)
	fieldByKey = indexFields(fields)
	children = buildChildren(fields)
	t.Cleanup(func() { fields, fieldByKey, children = oldFields, oldByKey, oldChildren })
}

func TestBoolAndDurationFlags(t *testing.T) {
	type ext struct {
		DDP struct {
			Overlap bool          `koanf:"overlap"`
			Naive   bool          `koanf:"naive"`
			Check   bool          `koanf:"check"`
			Timeout time.Duration `koanf:"timeout"`
		} `koanf:"ddp"`
		Steps int `koanf:"steps"`
	}
	withKeys(t, reflect.TypeOf(ext{}))

	l, err := flagLayer([]string{
		"--ddp.overlap",        // alone: true
		"--ddp.naive", "false", // a following bool is its value
		"--ddp.check", "7", // not a bool: check=true, and 7 is a stray argument
		"--ddp.timeout", "1m30s", // durations parse with units
		"--steps", "3",
	})
	require.Error(t, err)
	assert.Equal(t, `config: unexpected argument "7": config flags look like --key=value (e.g. --train.lr=1e-3)`, err.Error())
	assert.Equal(t, true, l.values["ddp.overlap"].Interface())
	assert.Equal(t, false, l.values["ddp.naive"].Interface())
	assert.Equal(t, true, l.values["ddp.check"].Interface())
	assert.Equal(t, 90*time.Second, l.values["ddp.timeout"].Interface())
	assert.Equal(t, 3, l.values["steps"].Interface())
	assert.Equal(t, "flag --ddp.timeout", l.origin["ddp.timeout"])

	_, err = flagLayer([]string{"--ddp.timeout=30", "--ddp.overlap=maybe"})
	require.Error(t, err)
	assert.Equal(t,
		`config: ddp.overlap="maybe" (from flag --ddp.overlap) is not true or false: use true or false`+"\n"+
			`config: ddp.timeout="30" (from flag --ddp.timeout) is not a duration: use a number with a unit such as 30s or 2m`,
		err.Error())
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestShowReportsWriteErrors(t *testing.T) {
	r, err := Load("", nil, nil)
	require.NoError(t, err)
	assert.EqualError(t, r.Show(failingWriter{}), "config: writing configuration: disk full")
}
