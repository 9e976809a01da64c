# tinyacc: build, demo, tests and benchmarks. `make demo` and `make test`
# install what they need (Debian packages as root, Go modules) by themselves.

GO       ?= go
PYTHON   ?= /usr/bin/python3
BIN      := build/tinyacc
APT_PKGS := gcc libopenblas-dev python3-torch python3-numpy python3-pytest python3-setuptools python3-venv libopenmpi-dev openmpi-bin
TEST_TIMEOUT ?= 20m

.PHONY: all deps build demo test test-go fuzz test-python test-readme vet python bench-step bench-comm bench-comm-netns bench-dp bench-layouts bench-bindings clean

all: build

# deps installs the Debian packages (OpenBLAS for matrix products, PyTorch
# and pytest for the reference tests) when one is missing, and the Go modules.
deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	$(GO) mod download

build: deps
	@mkdir -p build
	$(GO) build -o $(BIN) ./cmd/tinyacc

# demo trains the default GPT on the doc comments of the Go toolchain's own
# sources (examples/demo.yaml) for a few minutes, then samples from it:
# at a temperature of 0.6 among the 10 likeliest bytes a small model keeps
# to the words it has learned rather than spelling new ones.
demo: build
	$(BIN) train --config examples/demo.yaml
	$(BIN) sample --from build/demo.safetensors --prompt "The " --tokens 300 --temperature 0.6 --top_k 10

# vet also checks the tree as macOS builds it (no shared memory, /proc or
# Pdeathsig there: the files without them), which no test here would
# otherwise compile; capi, a C library built with cgo, is left out, cgo
# being off when cross-compiling. Once the cache is warm it adds seconds.
vet:
	$(GO) vet ./...
	GOOS=darwin $(GO) vet $$($(GO) list ./... | grep -v '/capi$$')
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }

test: deps vet test-go fuzz test-python test-readme

test-go:
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	CGO_ENABLED=0 $(GO) test -count=1 ./core/tensor/...

# fuzz runs every fuzz target of the repository for FUZZ_TIME each, beyond
# the seed inputs that test-go already runs. Minimizing a new input is
# capped at 100 runs: left at its default (a minute), a minimization still
# going when FUZZ_TIME ends fails the run with "context deadline exceeded".
FUZZ_TIME ?= 5s
fuzz:
	@for f in $$(grep -rl --include='*_test.go' '^func Fuzz' core plugins capi cmd); do \
		for n in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "fuzz ./$$(dirname $$f) $$n for $(FUZZ_TIME)"; \
			$(GO) test -run '^$$' -fuzz "^$$n$$" -fuzztime $(FUZZ_TIME) -fuzzminimizetime 100x ./$$(dirname $$f) || exit 1; \
		done; \
	done

test-python: python
	PYTHONDONTWRITEBYTECODE=1 $(PYTHON) -m pytest -q -p no:cacheprovider tools/torchref bench/test_comm_bench.py python/tests

# test-readme runs the README's sh blocks in order in a copy of the
# repository, step counts capped at TINYACC_README_STEPS (see
# tools/readmetest); blocks marked <!-- readme-test: skip --> are not run.
test-readme: deps
	TINYACC_README_TEST=1 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./tools/readmetest

# python builds libtinyacc.so into the Python package, for PYTHONPATH=python.
python: deps
	$(GO) build -buildmode=c-shared -o python/tinyacc/libtinyacc.so ./capi
	rm -f python/tinyacc/libtinyacc.h

bench-step: build
	$(BIN) bench step

# bench-comm: tinyacc vs Open MPI (mpirun) vs torch.distributed gloo, 2 and 4 ranks, one table
# with a memcpy row (Open MPI only where mpirun is installed).
bench-comm: build
	bench/comm.sh

# bench-comm-netns (root): tinyacc tcp across two network namespaces vs within one.
bench-comm-netns: build
	bench/comm_netns.sh

# bench-dp: DDP naive vs bucketed vs ZeRO-1/2/3 for dp=2 and dp=4 (tcp).
bench-dp: build
	$(BIN) bench dp --nproc 2,4

# bench-layouts: 1 process vs dp 2 vs tp 2 vs tp 2 + SP, same model and global batch (tcp).
bench-layouts: build
	$(BIN) bench layouts --nproc 2

# bench-bindings: ms/step of examples/python/train.py vs tinyacc train, same config.
bench-bindings: build python
	$(PYTHON) bench/bindings.py --no-build

clean:
	rm -rf build
