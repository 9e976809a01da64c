package config

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestConvert(t *testing.T) {
	intT := reflect.TypeOf(0)
	i32T := reflect.TypeOf(int32(0))
	floatT := reflect.TypeOf(0.0)
	strT := reflect.TypeOf("")
	boolT := reflect.TypeOf(false)
	cases := []struct {
		name string
		raw  any
		typ  reflect.Type
		want any // nil means the conversion must fail
	}{
		{"int from string", "42", intT, 42},
		{"int from padded string", " -7 ", intT, -7},
		{"int from yaml int", 42, intT, 42},
		{"int from uint64", uint64(5), intT, 5},
		{"int from whole float", 8388608.0, intT, 8388608},
		{"int from json number", json.Number("9007199254740993"), intT, 9007199254740993},
		{"int rejects fraction", 1.5, intT, nil},
		{"int rejects fraction string", "1.5", intT, nil},
		{"int rejects exponent string", "1e3", intT, nil},
		{"int rejects bool", true, intT, nil},
		{"int rejects huge uint", uint64(math.MaxUint64), intT, nil},
		{"int32 rejects overflow", "3000000000", i32T, nil},
		{"float from string", "1e-3", floatT, 1e-3},
		{"float from int", 3, floatT, 3.0},
		{"float from json number", json.Number("0.25"), floatT, 0.25},
		{"float rejects word", "fast", floatT, nil},
		{"float rejects NaN", "NaN", floatT, nil},
		{"float rejects Inf", math.Inf(1), floatT, nil},
		{"float rejects bool", false, floatT, nil},
		{"string as is", " a b ", strT, " a b "},
		{"string rejects int", 123, strT, nil},
		{"bool from string", "true", boolT, true},
		{"bool from 0", "0", boolT, false},
		{"bool from yaml", true, boolT, true},
		{"bool rejects int", 1, boolT, nil},
		{"bool rejects word", "yes", boolT, nil},
		{"duration from string", "1m30s", durationType, 90 * time.Second},
		{"duration rejects bare int", 30, durationType, nil},
		{"duration rejects no unit", "30", durationType, nil},
		{"list rejected", []any{1, 2}, intT, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, ok := convert(c.raw, c.typ)
			if c.want == nil {
				assert.False(t, ok, "got %v", v)
				return
			}
			if assert.True(t, ok) {
				assert.Equal(t, reflect.ValueOf(c.want).Convert(c.typ).Interface(), v.Interface())
			}
		})
	}
}
