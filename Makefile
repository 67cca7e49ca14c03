# The two commands a newcomer needs (README.md): `make demo` and `make test`.
# Each installs what it needs: the Python environment (pinned, pyproject.toml)
# and the local cluster's components (built once into ~/.cache/gpufleet).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: install demo test test-fast bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tools,dev]'
	touch $@

install: $(BIN)/.installed
	$(BIN)/invoke install

demo: install
	$(BIN)/invoke demo

test: install
	$(BIN)/pytest

# The tests that need no cluster (a few minutes): no Go build, no local cluster;
# only Debian's prometheus package (promtool and the rule tests' Prometheus).
test-fast: $(BIN)/.installed
	$(BIN)/invoke local.install --only prometheus
	$(BIN)/pytest -m "not cluster"

bench: install
	$(BIN)/invoke bench

clean:
	-$(BIN)/invoke local.down
	rm -rf $(VENV) out
