# waferscale: the main commands. Every target installs what it needs first
# (idempotent: fast when everything is already there).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MESH   ?= 4x4
SIM    ?= verilator
JOBS   ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(JOBS)

.PHONY: setup system-tools train test test-all demo sim bench lint verilog synth formal clean

setup: $(STAMP) system-tools

# Python packages, into a virtual environment (torch is pinned to the CPU build).
$(STAMP): pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing the Python packages into $(VENV) (log: $(VENV)/install.log)"
	@{ $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e ".[dev]"; } > $(VENV)/install.log 2>&1 \
	  || { tail -n 30 $(VENV)/install.log; exit 1; }
	@$(PY) -c "import wse, amaranth, cocotb, torch, numpy"
	@touch $(STAMP)

# System tools: Icarus Verilog (cocotb regressions), a C++ compiler (Verilator builds its
# models with it) and Yosys (the router's bounded proofs in the test suite). Installed with apt
# when missing.
system-tools:
	@{ command -v iverilog && command -v g++ && command -v yosys; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq iverilog g++ yosys >/dev/null; \
	  else echo "iverilog, g++ or yosys is missing: run 'sudo apt-get install -y iverilog g++ yosys'"; fi; }

test: setup
	$(PYTEST)

test-all: setup
	$(PYTEST) -m ""

# The main job: FC-MNIST trained on the simulated fabric (functional backend).
train: setup
	$(VENV)/bin/wse train examples/fc_mnist.py --backend functional --mesh 16x16 --batch 64 --epochs 5

demo: setup
	$(PY) examples/demo.py

# The co-simulation regression: cocotb testbenches of the RTL against the golden model
# (SIM=verilator|icarus, MESH=WxH, WAVES=1 writes FST waveforms), ending with a summary table.
sim: setup
	$(PY) -m wse.sim.cosim.regress --sim $(SIM) --mesh $(MESH) $(if $(filter 1,$(WAVES)),--waves)

bench: setup
	$(PY) bench/golden_speed.py
	$(PY) bench/train_speed.py
	$(PY) bench/sim_speed.py
	$(PY) bench/trace_cost.py
	$(PY) bench/progress_cost.py

# ruff, then the import layers (wse/layers.py: the import-linter contracts of pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check wse hdl firmware sim host tests bench examples
	$(PY) -m wse.layers

verilog: setup
	$(PY) -m wse.hdl.export --mesh $(MESH) -o build/verilog

synth: setup
	@command -v yosys >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq yosys >/dev/null; \
	  else echo "yosys is missing: run 'sudo apt-get install -y yosys'"; exit 1; fi; }
	$(PY) -m wse.hdl.export --synth -o build/synth

# Router properties (docs/faults.md section 2): proved unbounded by k-induction, whole payload, three routers.
formal: setup
	@command -v yosys >/dev/null 2>&1 && command -v z3 >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq yosys z3 >/dev/null; \
	  else echo "yosys or z3 is missing: run 'sudo apt-get install -y yosys z3'"; exit 1; fi; }
	$(PY) -m wse.hdl.formal --induction --bits 33 --depth 4 --colors 2 --router-depth 2
	$(PY) -m wse.hdl.formal --induction --bits 33 --depth 4 --colors 3 --router-depth 3
	$(PY) -m wse.hdl.formal --induction --bits 33 --depth 2 --colors 16 --router-depth 2

clean:
	rm -rf build sim_build runs .pytest_cache
