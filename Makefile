# The two commands a newcomer needs (README.md): `make demo` and `make test`.
# Each installs what it needs: the Python environment (pinned, pyproject.toml)
# and the local cluster's components (built once into ~/.cache/gpufleet).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: install demo test test-fast test-integration bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tools,dev]'
	touch $@

install: $(BIN)/.installed
	$(BIN)/invoke install

demo: install
	$(BIN)/invoke demo

# The whole suite, every tier (what .ci/run runs).
test: install
	$(BIN)/pytest

# The unit tier (tests/README.md; a few minutes): every test that needs no cluster, no API
# server and no image build. It installs what it reads itself: Debian's prometheus package
# (promtool and the rule tests' Prometheus) and the pinned Go modules whose schemas the
# render tests validate against (module zips only: nothing is built).
test-fast: $(BIN)/.installed
	$(BIN)/invoke local.install --only prometheus
	$(BIN)/python -c "from gpufleet_admin.schemas import fetch; fetch()"
	$(BIN)/pytest -m "not cluster and not integration and not build"

# The integration tier: a real etcd and kube-apiserver (seconds to start once installed).
test-integration: $(BIN)/.installed
	$(BIN)/invoke local.install --only etcd,kubernetes
	$(BIN)/pytest -m integration

bench: install
	$(BIN)/invoke bench

clean:
	-$(BIN)/invoke local.down
	rm -rf $(VENV) out
