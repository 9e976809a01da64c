"""Builds libtinyacc.so into the package (and the CLI into build/) once per
test session, so `python -m pytest python/tests` works from a bare checkout
with Go installed. TINYACC_LIB, when set, is used as is."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(REPO, "python")
CLI = os.path.join(REPO, "build", "tinyacc")


def _go_build(*args):
    subprocess.run(["go", "build"] + list(args), cwd=REPO, check=True)


if not os.environ.get("TINYACC_LIB"):
    _go_build("-buildmode=c-shared", "-o", os.path.join(PKG, "tinyacc", "libtinyacc.so"), "./capi")
    header = os.path.join(PKG, "tinyacc", "libtinyacc.h")
    if os.path.exists(header):
        os.remove(header)
sys.path.insert(0, PKG)


@pytest.fixture(scope="session")
def cli():
    """The tinyacc command line, freshly built."""
    _go_build("-o", CLI, "./cmd/tinyacc")
    return CLI


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A small deterministic text corpus."""
    lines = ["line %d: func f%d(x int) int { return x*%d + %d }\n" % (i, i % 37, i % 11, i % 7) for i in range(3000)]
    p = tmp_path_factory.mktemp("data") / "corpus.txt"
    p.write_text("".join(lines))
    return str(p)


def small_config(corpus, steps=20, **train):
    """YAML of a tiny GPT on corpus; one compute thread keeps runs bitwise
    reproducible across processes."""
    t = {"steps": steps, "batch_size": 4, "grad_accum": 1, "threads": 1, "warmup_steps": 2,
         "lr": 3e-3, "eval_every": 0, "eval_batches": 2}
    t.update(train)
    return ("model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 32}\n"
            "train: {%s}\n"
            "data: {path: %r, val_fraction: 0.1}\n") % (", ".join("%s: %r" % kv for kv in t.items()), corpus)


@pytest.fixture
def config_file(tmp_path, corpus):
    def make(**kw):
        p = tmp_path / "run.yaml"
        p.write_text(small_config(corpus, **kw))
        return str(p)
    return make
