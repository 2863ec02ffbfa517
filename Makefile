# tensorlift: every target installs what it needs first (scripts/setup.sh is
# idempotent and quiet when all is present): make demo only the build's packages and
# one environment, the others everything the tests use.
.PHONY: all setup build test demo bench fuzz format clean gpu-check soak wheel

all: build

setup:
	@bash scripts/setup.sh

build: setup
	@bash scripts/build.sh build
	@bash scripts/install_python.sh

test: setup
	@bash scripts/test.sh

demo:
	@bash scripts/setup.sh demo
	@bash scripts/demo.sh

bench: build
	@bash bench/run.sh

# The GPU validation (docs/gpu.md): STEP=setup|test|bench|all|bundle, OUT=DIR.
# Without a GPU it checks its scripts and says so in one line.
# The manylinux wheel users install, in dist/ (scripts/wheel.sh, docs/install.md).
wheel: setup
	@bash scripts/wheel.sh

gpu-check:
	@STEP=$${STEP:-all} bash scripts/gpu_check.sh

fuzz: setup
	@bash tests/fuzz/run.sh $${FUZZ_SECONDS:-600}

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf build build-asan build-fuzz build-tsan build-wheel build-demo dist

# 30 minutes of loads, fetches from a seed and abandoned streams; RSS, fds, threads and
# io_uring instances must stay flat (docs/security.md, "Soak"). SOAK_SECONDS overrides.
soak: build
	@TENSORLIFT_CLI=build/tensorlift .venv/bin/python tests/soak/soak.py --seconds $${SOAK_SECONDS:-1800} --out build/soak.md
