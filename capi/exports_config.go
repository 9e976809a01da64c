package main

/*
#include <stdint.h>
*/
import "C"

//export tinyacc_config_resolve
func tinyacc_config_resolve(file, text, args *C.char, out *C.int64_t) C.int {
	return call(func() error {
		f, err := cString("config file", file, true)
		if err != nil {
			return err
		}
		s, err := cString("config text", text, true)
		if err != nil {
			return err
		}
		a, err := cString("config flags", args, true)
		if err != nil {
			return err
		}
		if err := outPtr("config", out); err != nil {
			return err
		}
		h, err := apiConfigResolve(f, s, a)
		*out = C.int64_t(h)
		return err
	})
}

//export tinyacc_config_get
func tinyacc_config_get(cfg C.int64_t, key *C.char, buf *C.char, cap C.int64_t, need *C.int64_t) C.int {
	return call(func() error {
		k, err := cString("config key", key, false)
		if err != nil {
			return err
		}
		v, err := apiConfigGet(int64(cfg), k)
		if err != nil {
			return err
		}
		return putString("config value", v, buf, cap, need)
	})
}

//export tinyacc_config_get_int
func tinyacc_config_get_int(cfg C.int64_t, key *C.char, value *C.int64_t) C.int {
	return call(func() error {
		k, err := cString("config key", key, false)
		if err != nil {
			return err
		}
		if err := outPtr("value", value); err != nil {
			return err
		}
		n, err := apiConfigGetInt(int64(cfg), k)
		*value = C.int64_t(n)
		return err
	})
}
